"""Building blocks of the engine's models: attention backends, rotary and ALiBi positions, norms."""
