"""sync_for: BSP / SSP / Hybrid minibatch loops and owner aggregation."""
