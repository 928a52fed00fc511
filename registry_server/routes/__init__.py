"""API routes, one module per noun, mounted under /api/v1."""
