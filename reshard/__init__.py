"""The reshard domain: start/cancel services, launchers, runner, janitor, password stash."""
