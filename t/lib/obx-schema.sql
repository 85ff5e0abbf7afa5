-- obx-schema.sql: every object of schema obx and of the extension obx, one
-- line each with its definition, in an order that does not depend on how it
-- was made (t/092_upgrade_1_1.pl compares a fresh install with updated
-- ones).  pg_dump cannot serve: it dumps an extension's objects as one
-- CREATE EXTENSION.  Columns are listed in their order (dropped ones left
-- out), with type, collation, nullability, default and generation.
-- obx._era()'s constant is drawn at random per install: it shows as N.
-- A definition's lines after its first are indented by two spaces, so
-- that every object starts a line of its own.
WITH rel AS (
	SELECT c.oid, c.relname, c.relkind
	  FROM pg_class c
	 WHERE c.relnamespace = 'obx'::regnamespace
)
SELECT replace(line, E'\n', E'\n  ') FROM (
	SELECT 'relation ' || c.relname || ' kind=' || c.relkind::text
		   || ' persistence=' || c.relpersistence::text
		   || ' owner=' || pg_get_userbyid(c.relowner)
		   || ' options=' || coalesce(c.reloptions::text, '')
		   || ' bound=' || coalesce(pg_get_expr(c.relpartbound, c.oid), '')
		   || ' partkey=' || coalesce(pg_get_partkeydef(c.oid), '')
		   || ' acl=' || coalesce(c.relacl::text, '')
		   || ' comment=' || coalesce(obj_description(c.oid, 'pg_class'), '') AS line
	  FROM pg_class c WHERE c.relnamespace = 'obx'::regnamespace AND c.relkind <> 'i'
	UNION ALL
	SELECT 'column ' || r.relname || ' ' || row_number() OVER (PARTITION BY r.oid ORDER BY a.attnum)
		   || ' ' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
		   || CASE WHEN a.attcollation <> t.typcollation
				   THEN ' collate ' || (SELECT collname FROM pg_collation WHERE oid = a.attcollation)
				   ELSE '' END
		   || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
		   || coalesce(' default ' || pg_get_expr(d.adbin, d.adrelid), '')
		   || CASE WHEN a.attgenerated <> '' THEN ' generated ' || a.attgenerated::text ELSE '' END
		   || CASE WHEN a.attidentity <> '' THEN ' identity ' || a.attidentity::text ELSE '' END
		   || coalesce(' acl=' || a.attacl::text, '')
		   || coalesce(' comment=' || col_description(r.oid, a.attnum), '')
	  FROM rel r
	  JOIN pg_attribute a ON a.attrelid = r.oid AND a.attnum > 0 AND NOT a.attisdropped
	  JOIN pg_type t ON t.oid = a.atttypid
	  LEFT JOIN pg_attrdef d ON d.adrelid = r.oid AND d.adnum = a.attnum
	 WHERE r.relkind <> 'i' AND r.relkind <> 'S'
	UNION ALL
	SELECT 'constraint ' || r.relname || ' ' || k.conname || ' ' || pg_get_constraintdef(k.oid)
	  FROM rel r JOIN pg_constraint k ON k.conrelid = r.oid
	UNION ALL
	SELECT 'index ' || i.indexname || ' ' || i.indexdef
	  FROM pg_indexes i WHERE i.schemaname = 'obx'
	UNION ALL
	SELECT 'trigger ' || pg_get_triggerdef(g.oid)
	  FROM rel r JOIN pg_trigger g ON g.tgrelid = r.oid AND NOT g.tgisinternal
	UNION ALL
	SELECT 'view ' || r.relname || ' ' || pg_get_viewdef(r.oid)
	  FROM rel r WHERE r.relkind IN ('v', 'm')
	UNION ALL
	SELECT 'sequence ' || s.sequencename || ' ' || s.data_type || ' ' || s.start_value
		   || ' ' || s.increment_by || ' ' || s.max_value || ' ' || s.cache_size
		   || ' owned by ' || coalesce((SELECT t.relname || '.' || a.attname
										  FROM pg_depend dp
										  JOIN pg_class t ON t.oid = dp.refobjid
										  JOIN pg_attribute a ON a.attrelid = t.oid
															 AND a.attnum = dp.refobjsubid
										 WHERE dp.classid = 'pg_class'::regclass
										   AND dp.objid = (s.schemaname || '.' || s.sequencename)::regclass
										   AND dp.deptype = 'a'), '')
	  FROM pg_sequences s WHERE s.schemaname = 'obx'
	UNION ALL
	SELECT 'function ' || p.oid::regprocedure
		   || ' owner=' || pg_get_userbyid(p.proowner)
		   || ' acl=' || coalesce(p.proacl::text, '')
		   || ' comment=' || coalesce(obj_description(p.oid, 'pg_proc'), '')
		   || ' ' || regexp_replace(pg_get_functiondef(p.oid), '\$function\$SELECT [0-9]+\$function\$', '$function$SELECT N$function$')
	  FROM pg_proc p WHERE p.pronamespace = 'obx'::regnamespace
	UNION ALL
	SELECT 'type ' || t.oid::regtype || ' ' || t.typtype::text
		   || ' comment=' || coalesce(obj_description(t.oid, 'pg_type'), '')
	  FROM pg_type t
	 WHERE t.typnamespace = 'obx'::regnamespace
	   AND NOT EXISTS (SELECT 1 FROM pg_class c WHERE c.reltype = t.oid AND c.relkind <> 'c')
	   AND t.typelem = 0
	UNION ALL
	SELECT 'schema obx owner=' || pg_get_userbyid(n.nspowner) || ' acl=' || coalesce(n.nspacl::text, '')
		   || ' comment=' || coalesce(obj_description(n.oid, 'pg_namespace'), '')
	  FROM pg_namespace n WHERE n.nspname = 'obx'
	UNION ALL
	SELECT 'member ' || pg_describe_object(d.classid, d.objid, d.objsubid)
	  FROM pg_depend d JOIN pg_extension x ON x.oid = d.refobjid
	 WHERE d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e' AND x.extname = 'obx'
	UNION ALL
	SELECT 'config ' || c::regclass || ' ' || coalesce(w, '')
	  FROM pg_extension x, unnest(x.extconfig, x.extcondition) AS u(c, w)
	 WHERE x.extname = 'obx'
	UNION ALL
	SELECT 'role ' || r.rolname || ' login=' || r.rolcanlogin || ' super=' || r.rolsuper
	  FROM pg_roles r WHERE r.rolname LIKE 'obx\_%'
) all_lines
ORDER BY line COLLATE "C";
