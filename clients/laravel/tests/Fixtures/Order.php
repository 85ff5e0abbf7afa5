<?php

namespace Obx\Laravel\Tests\Fixtures;

use Illuminate\Database\Eloquent\Model;
use Obx\Laravel\Eloquent\WritesInTransaction;

/** A model whose "created" event publishes OrderCreated, saved in a transaction of its own. */
class Order extends Model
{
    use WritesInTransaction;

    public $incrementing = false;
    public $timestamps = false;
    protected $keyType = 'string';
    protected $guarded = [];
    protected $dispatchesEvents = ['created' => OrderCreated::class];
}
