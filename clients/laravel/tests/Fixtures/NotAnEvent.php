<?php

namespace Obx\Laravel\Tests\Fixtures;

/** An event that does not publish itself: the listener must ignore it. */
class NotAnEvent
{
}
