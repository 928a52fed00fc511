"""Server-rendered pages: the environment list (with search) and one page per environment."""
