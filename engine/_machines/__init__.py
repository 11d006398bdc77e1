"""The pure machines: planner, colouring, schedule value, turnstile, grant codec, SSP clock."""
