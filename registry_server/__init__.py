"""The envkit registry server (FastAPI + SQLAlchemy). Not built yet: see the open registry issue."""
