# ObxSecurity.pm: shared pieces of the security tests, t/07*_sec_*.pl.
#
# An attacker here is a role with only the documented grants of a
# subscriber (or a non-superuser database owner).  Its functions call
# public.pwn(what), which records who ran them and whether that role is a
# superuser in public.pwned, and tries to make the attacker a superuser.
# A test then asserts that nothing ran as a superuser and that the
# attacker is still an ordinary role.
package ObxSecurity;

use strict;
use warnings;

use Exporter 'import';
use Test::More;
use ObxConsumer ();

our @EXPORT = qw(sec_setup subscriber_role mallory_node ran_as_superuser attacker_is_superuser
  no_escalation);

# sec_setup($node): the recorder, public.pwn(what) and public.pwned.
sub sec_setup
{
	my ($node) = @_;
	$node->safe_psql('postgres', q{
		CREATE TABLE public.pwned (
			n serial PRIMARY KEY,
			who name NOT NULL,
			super boolean NOT NULL,
			what text NOT NULL,
			pid integer NOT NULL DEFAULT pg_catalog.pg_backend_pid());
		GRANT INSERT, SELECT ON public.pwned TO PUBLIC;
		GRANT USAGE ON SEQUENCE public.pwned_n_seq TO PUBLIC;
		CREATE FUNCTION public.pwn(what text) RETURNS void
		LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
		BEGIN
			INSERT INTO public.pwned (who, super, what)
			SELECT current_user, r.rolsuper, what
			  FROM pg_catalog.pg_roles r WHERE r.rolname = current_user;
			BEGIN
				EXECUTE 'ALTER ROLE mallory SUPERUSER';
			EXCEPTION WHEN OTHERS THEN
				NULL;
			END;
		END
		$$;
		GRANT EXECUTE ON FUNCTION public.pwn(text) TO PUBLIC;
	});
	return;
}

# subscriber_role($node, $role): a login role with the documented grants
# of a subscriber (docs/sql.md) and a schema of its own.
sub subscriber_role
{
	my ($node, $role) = @_;
	$node->safe_psql('postgres', qq{
		CREATE ROLE $role LOGIN;
		CREATE SCHEMA $role AUTHORIZATION $role;
		GRANT USAGE ON SCHEMA obx TO $role;
		GRANT INSERT, UPDATE, SELECT ON obx.subscriptions TO $role;
		GRANT EXECUTE ON FUNCTION obx.subscribe(text, text[], regprocedure, jsonb),
			obx.unsubscribe(text) TO $role;
	});
	return;
}

# mallory_node($name, $broker, %opt): a consumer test's node
# (ObxConsumer::consumer_node, %opt as there; no shop schema) with the
# recorder (sec_setup) and the attacker, mallory, a subscriber.
sub mallory_node
{
	my ($name, $broker, %opt) = @_;
	my $node = ObxConsumer::consumer_node($name, $broker, effects => 0, %opt);
	sec_setup($node);
	subscriber_role($node, 'mallory');
	return $node;
}

# ran_as_superuser($node): what the attacker's functions ran as a
# superuser, as "what by who" lines.
sub ran_as_superuser
{
	my ($node) = @_;
	return $node->safe_psql('postgres',
		q{SELECT coalesce(pg_catalog.string_agg(what || ' by ' || who, ', ' ORDER BY n), '')
		    FROM public.pwned WHERE super});
}

sub attacker_is_superuser
{
	my ($node) = @_;
	return $node->safe_psql('postgres',
		q{SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = 'mallory'});
}

# no_escalation($node, $what): nothing ran as a superuser, mallory is not one.
sub no_escalation
{
	my ($node, $what) = @_;
	is(ran_as_superuser($node), '', "$what: no attacker function ran as a superuser");
	is(attacker_is_superuser($node), 'f', "$what: mallory is not a superuser");
	return;
}

1;
