"""async_for: reconnaissance, the plan guard, the closure rule, execution."""
