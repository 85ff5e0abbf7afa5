<?php

namespace Obx\Laravel\Tests\Fixtures;

use Illuminate\Database\Eloquent\Model;

/** A model whose "created" event publishes OrderCreated; Laravel's save() opens no transaction. */
class PlainOrder extends Model
{
    public $incrementing = false;
    public $timestamps = false;
    protected $table = 'orders';
    protected $keyType = 'string';
    protected $guarded = [];
    protected $dispatchesEvents = ['created' => OrderCreated::class];
}
