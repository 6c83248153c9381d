"""mmfragile."""
