"""Device specs: one YAML file per device family (data only; read by perfcounter.devices)."""
