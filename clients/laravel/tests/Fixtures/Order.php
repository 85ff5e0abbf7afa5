<?php

namespace Obx\Laravel\Tests\Fixtures;

use Obx\Laravel\Eloquent\WritesInTransaction;

/** PlainOrder saved in a transaction of its own. */
class Order extends PlainOrder
{
    use WritesInTransaction;
}
