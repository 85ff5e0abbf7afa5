<?php

use Illuminate\Database\Migrations\Migration;
use Illuminate\Support\Facades\DB;

/*
 * inventory.reserve_stock(obx.inbound_event): the handler obx's consumer
 * workers call for each OrderPlaced message, inside the transaction in
 * which obx has just recorded the event id with obx.mark_processed.  obx
 * calls it only for event ids not processed before, so it reserves without
 * checking for duplicates itself.  If it raises, obx rolls its work back
 * and keeps the message as a dead letter (or retries, for transient
 * errors such as a deadlock).
 *
 * Versions: 1 reserves from warehouse "main"; 2 adds the optional
 * "warehouse" (absent: "main").  Other versions are refused, so they wait
 * as dead letters until the handler learns them (obx.replay_dead_letter).
 */
return new class extends Migration
{
    protected $connection = 'inventory';

    public function up(): void
    {
        // unprepared: a function body is no place for PDO placeholders
        DB::connection($this->connection)->unprepared(<<<'SQL'
CREATE FUNCTION inventory.reserve_stock(e obx.inbound_event)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    v_version   integer;
    v_warehouse text;
    v_order_id  text := e.payload->>'orderId';
    v_reserved  boolean;
    v_line      record;
BEGIN
    IF e.event_type IS DISTINCT FROM 'OrderPlaced' THEN
        RETURN;             -- another event type on the topic: not ours
    END IF;

    v_version := (e.payload->>'schemaVersion')::integer;
    IF v_version IS NULL OR v_version NOT IN (1, 2) THEN
        RAISE EXCEPTION 'OrderPlaced schemaVersion % is not supported',
            coalesce(v_version::text, 'missing')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF v_order_id IS NULL OR jsonb_typeof(e.payload->'lines') IS DISTINCT FROM 'array'
       OR jsonb_array_length(e.payload->'lines') = 0 THEN
        RAISE EXCEPTION 'OrderPlaced event % has no orderId or no lines', e.event_id
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    v_warehouse := CASE WHEN v_version >= 2
                        THEN coalesce(e.payload->>'warehouse', 'main')
                        ELSE 'main' END;

    -- One line per sku, in sku order: every handler locks stock rows in the
    -- same order, so two of them cannot deadlock.
    FOR v_line IN
        SELECT l->>'sku' AS sku, sum((l->>'qty')::integer) AS qty
          FROM jsonb_array_elements(e.payload->'lines') AS l
         GROUP BY 1
         ORDER BY 1
    LOOP
        IF v_line.sku IS NULL OR v_line.qty IS NULL OR v_line.qty <= 0 THEN
            RAISE EXCEPTION 'OrderPlaced event % has a line without sku or a positive qty', e.event_id
                USING ERRCODE = 'invalid_parameter_value';
        END IF;

        UPDATE inventory.stock
           SET reserved = reserved + v_line.qty
         WHERE warehouse = v_warehouse
           AND sku = v_line.sku
           AND on_hand - reserved >= v_line.qty;
        v_reserved := FOUND;

        INSERT INTO inventory.reservations
               (event_id, order_id, warehouse, sku, qty, status, schema_version)
        VALUES (e.event_id, v_order_id, v_warehouse, v_line.sku, v_line.qty,
                CASE WHEN v_reserved THEN 'reserved' ELSE 'backordered' END, v_version);
    END LOOP;
END
$$
SQL);
    }

    public function down(): void
    {
        DB::connection($this->connection)->statement(
            'DROP FUNCTION inventory.reserve_stock(obx.inbound_event)');
    }
};
