"""Example applications written with the Parrot SDK (parrot.frontend); see each module's docstring."""
