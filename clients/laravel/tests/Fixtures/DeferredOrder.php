<?php

namespace Obx\Laravel\Tests\Fixtures;

use Illuminate\Database\Eloquent\Model;

/** A model that maps "created" to an event Laravel 10.30+ would dispatch after the commit. */
class DeferredOrder extends Model
{
    public $incrementing = false;
    public $timestamps = false;
    protected $table = 'orders';
    protected $keyType = 'string';
    protected $guarded = [];
    protected $dispatchesEvents = ['created' => DeferredOrderCreated::class];
}
