"""health reports say who sent them (the token, whether it is the namespace's own) and from which
run, and count verifier failures apart from infra failures

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("health_reports") as batch:
        batch.add_column(sa.Column("verifier_failures", sa.Integer, nullable=False, server_default="0"))
        batch.add_column(sa.Column("token_id", sa.String(32), nullable=True))
        batch.add_column(sa.Column("run", sa.String(200), nullable=True))
        batch.add_column(sa.Column("own", sa.Boolean, nullable=False, server_default=sa.false()))
        batch.create_index("ix_health_reports_token_version_time", ["token_id", "version_id", "created_at"])


def downgrade() -> None:
    with op.batch_alter_table("health_reports") as batch:
        batch.drop_index("ix_health_reports_token_version_time")
        for column in ("own", "run", "token_id", "verifier_failures"):
            batch.drop_column(column)
