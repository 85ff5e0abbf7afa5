<?php

namespace Illuminate\Contracts\Events;

/**
 * Laravel 10.30's marker for events dispatched after the commit, for the
 * tests on a Laravel that has none (Debian's 8): the package only asks
 * whether an event implements it.
 */
interface ShouldDispatchAfterCommit
{
}
