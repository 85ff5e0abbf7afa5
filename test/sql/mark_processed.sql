--
-- obx.mark_processed(consumer, event_id): the consumer's inbox.  True the
-- first time a consumer records an event, false for a duplicate, inside
-- the consumer's own transaction.
--
\set VERBOSITY default
\set SHOW_CONTEXT never
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS obx;
RESET client_min_messages;
TRUNCATE obx.events, obx.claims, obx.records, obx.event_states, obx.processed_events;

-- First time true, then false for the same consumer and event.
SELECT obx.mark_processed('inventory-reservation', 'evt_01JQ8X8F') AS first;
SELECT obx.mark_processed('inventory-reservation', 'evt_01JQ8X8F') AS duplicate;
SELECT obx.mark_processed('inventory-reservation', 'evt_01JQ8X8F') AS duplicate_again;

-- Another consumer has its own history; another event is new.
SELECT obx.mark_processed('billing', 'evt_01JQ8X8F') AS other_consumer;
SELECT obx.mark_processed('inventory-reservation', 'evt_01JQ8X8G') AS other_event;
-- Event ids are text: ids of obx events (uuids) and foreign ids alike,
-- compared exactly.
SELECT obx.mark_processed('billing', '0190f5c2-5c1a-7d3e-8a4b-123456789abc') AS uuid_id;
SELECT obx.mark_processed('billing', '0190F5C2-5C1A-7D3E-8A4B-123456789ABC') AS upper_case_is_another_id;
SELECT obx.mark_processed('Billing', 'evt_01JQ8X8F') AS consumer_names_are_case_sensitive;

SELECT consumer_name, event_id, processed_at IS NOT NULL AS has_processed_at
  FROM obx.processed_events ORDER BY consumer_name COLLATE "C", event_id COLLATE "C";

-- Inside a transaction: the effect and the mark commit or roll back together.
BEGIN;
SELECT obx.mark_processed('inventory-reservation', 'evt_rolled_back') AS first_in_tx;
SELECT obx.mark_processed('inventory-reservation', 'evt_rolled_back') AS duplicate_in_tx;
ROLLBACK;
-- The rolled-back mark is gone: the redelivered event is processed again.
SELECT obx.mark_processed('inventory-reservation', 'evt_rolled_back') AS after_rollback;
SELECT obx.mark_processed('inventory-reservation', 'evt_rolled_back') AS duplicate_after_commit;

-- The same with a savepoint.
BEGIN;
SAVEPOINT s;
SELECT obx.mark_processed('inventory-reservation', 'evt_savepoint') AS first_in_savepoint;
ROLLBACK TO SAVEPOINT s;
SELECT obx.mark_processed('inventory-reservation', 'evt_savepoint') AS again_after_rollback_to;
COMMIT;
SELECT obx.mark_processed('inventory-reservation', 'evt_savepoint') AS duplicate_after_commit;

-- Empty or NULL inputs are errors.
SELECT obx.mark_processed('', 'evt_1');
\echo :SQLSTATE
SELECT obx.mark_processed(NULL, 'evt_1');
\echo :SQLSTATE
SELECT obx.mark_processed('billing', '');
\echo :SQLSTATE
SELECT obx.mark_processed('billing', NULL);
\echo :SQLSTATE
SELECT obx.mark_processed(NULL, NULL);
\echo :SQLSTATE

-- An error in a consumer's transaction aborts it, mark included.
BEGIN;
SELECT obx.mark_processed('billing', 'evt_failed_tx') AS first;
SELECT obx.mark_processed('billing', '');
\echo :SQLSTATE
COMMIT;
SELECT count(*) AS marks_of_failed_tx FROM obx.processed_events
 WHERE event_id = 'evt_failed_tx';

SELECT consumer_name, count(*) AS events
  FROM obx.processed_events GROUP BY consumer_name ORDER BY consumer_name COLLATE "C";

--
-- Who may mark: the consumer name belongs to the first role that marks for
-- it; another role is refused, a member of the owner role acts for it.
-- The caller is the role the statement runs as (SET ROLE included), in
-- both installs.
--
CREATE ROLE regress_mark_bob;
CREATE ROLE regress_mark_mallory;
CREATE ROLE regress_mark_deputy IN ROLE regress_mark_bob;
CREATE ROLE "Regress Mark Carol";
GRANT USAGE ON SCHEMA obx TO regress_mark_bob, regress_mark_mallory, regress_mark_deputy,
	"Regress Mark Carol";
GRANT EXECUTE ON FUNCTION obx.mark_processed(text, text)
	TO regress_mark_bob, regress_mark_mallory, regress_mark_deputy, "Regress Mark Carol";
SET ROLE regress_mark_bob;
SELECT obx.mark_processed('shipping', 'evt_1') AS bob_first;
RESET ROLE;
SELECT owner FROM obx.consumer_owners WHERE consumer_name = 'shipping';
SET ROLE regress_mark_mallory;
SELECT obx.mark_processed('shipping', 'evt_2');
\echo :SQLSTATE
-- Refused, it leaves no mark for the owner's consumer to skip.
RESET ROLE;
SELECT count(*) AS evt_2_marks FROM obx.processed_events WHERE event_id = 'evt_2';
SET ROLE regress_mark_deputy;
SELECT obx.mark_processed('shipping', 'evt_2') AS deputy_first;
SELECT obx.mark_processed('shipping', 'evt_1') AS deputy_duplicate;
RESET ROLE;
-- A role whose name needs quotes claims a name as itself.
SET ROLE "Regress Mark Carol";
SELECT obx.mark_processed('billing-carol', 'evt_1') AS carol_first;
RESET ROLE;
SELECT owner FROM obx.consumer_owners WHERE consumer_name = 'billing-carol';
-- A superuser may act for any consumer, and claims no name by doing so.
SELECT obx.mark_processed('shipping', 'evt_3') AS superuser_first;
SELECT obx.mark_processed('unclaimed', 'evt_1') AS superuser_unclaimed;
SELECT count(*) AS unclaimed_owners FROM obx.consumer_owners WHERE consumer_name = 'unclaimed';
DELETE FROM obx.processed_events WHERE consumer_name IN ('shipping', 'unclaimed', 'billing-carol');
DELETE FROM obx.consumer_owners WHERE consumer_name IN ('shipping', 'billing-carol');
REVOKE ALL ON FUNCTION obx.mark_processed(text, text)
	FROM regress_mark_bob, regress_mark_mallory, regress_mark_deputy, "Regress Mark Carol";
REVOKE USAGE ON SCHEMA obx FROM regress_mark_bob, regress_mark_mallory, regress_mark_deputy,
	"Regress Mark Carol";
DROP ROLE regress_mark_deputy, regress_mark_mallory, regress_mark_bob, "Regress Mark Carol";
