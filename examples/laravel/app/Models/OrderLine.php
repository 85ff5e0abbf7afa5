<?php

namespace App\Models;

use Illuminate\Database\Eloquent\Model;
use Illuminate\Database\Eloquent\Relations\BelongsTo;

class OrderLine extends Model
{
    protected $connection = 'shop';

    public $timestamps = false;

    protected $fillable = ['sku', 'qty', 'unit_price_minor'];

    protected $casts = ['qty' => 'integer', 'unit_price_minor' => 'integer'];

    public function order(): BelongsTo
    {
        return $this->belongsTo(Order::class);
    }
}
