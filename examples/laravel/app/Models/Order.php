<?php

namespace App\Models;

use Illuminate\Database\Eloquent\Model;
use Illuminate\Database\Eloquent\Relations\HasMany;

/**
 * An order of the shop.  Its id ("ord_...") is chosen by the application
 * before the first attempt to save it, so that a retry after a lost
 * connection can tell whether the first attempt committed.
 */
class Order extends Model
{
    protected $connection = 'shop';

    protected $keyType = 'string';

    public $incrementing = false;

    protected $fillable = ['id', 'customer_id', 'total_minor', 'currency', 'warehouse'];

    protected $casts = ['total_minor' => 'integer'];

    public function lines(): HasMany
    {
        return $this->hasMany(OrderLine::class);
    }
}
