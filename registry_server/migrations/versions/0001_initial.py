"""initial schema: users, namespaces, tokens, environments, blobs, versions, health reports

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "users",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(64), nullable=False, unique=True),
        sa.Column("is_admin", sa.Boolean, nullable=False),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_table(
        "namespaces",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(64), nullable=False, unique=True),
        sa.Column("owner_id", sa.Integer, sa.ForeignKey("users.id"), nullable=False),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_table(
        "tokens",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("public_id", sa.String(32), nullable=False, unique=True),
        sa.Column("secret_hash", sa.String(64), nullable=False),
        sa.Column("user_id", sa.Integer, sa.ForeignKey("users.id"), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("revoked_at", TS, nullable=True),
        sa.Column("last_used_at", TS, nullable=True),
    )
    op.create_table(
        "token_scopes",
        sa.Column("token_id", sa.Integer, sa.ForeignKey("tokens.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("namespace_id", sa.Integer, sa.ForeignKey("namespaces.id", ondelete="CASCADE"), primary_key=True),
    )
    op.create_table(
        "environments",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("namespace_id", sa.Integer, sa.ForeignKey("namespaces.id"), nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("description", sa.Text, nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.UniqueConstraint("namespace_id", "name"),
    )
    op.create_table(
        "blobs",
        sa.Column("digest", sa.String(71), primary_key=True),
        sa.Column("size", sa.BigInteger, nullable=False),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_table(
        "versions",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("environment_id", sa.Integer, sa.ForeignKey("environments.id"), nullable=False),
        sa.Column("version", sa.String(128), nullable=False),
        sa.Column("bundle_digest", sa.String(71), sa.ForeignKey("blobs.digest"), nullable=False),
        sa.Column("image_id", sa.String(71), nullable=False),
        sa.Column("base_image", sa.String(200), nullable=False),
        sa.Column("oci_ref", sa.String(300), nullable=True),
        sa.Column("spec", sa.JSON, nullable=False),
        sa.Column("task_count", sa.Integer, nullable=False),
        sa.Column("size", sa.BigInteger, nullable=False),
        sa.Column("publisher_id", sa.Integer, sa.ForeignKey("users.id"), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("yanked", sa.Boolean, nullable=False),
        sa.Column("yank_reason", sa.Text, nullable=True),
        sa.Column("deprecated", sa.Boolean, nullable=False),
        sa.Column("successor", sa.String(200), nullable=True),
        sa.UniqueConstraint("environment_id", "version"),
    )
    op.create_table(
        "health_reports",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("version_id", sa.Integer, sa.ForeignKey("versions.id", ondelete="CASCADE"), nullable=False),
        sa.Column("reporter_id", sa.Integer, sa.ForeignKey("users.id"), nullable=False),
        sa.Column("episodes", sa.Integer, nullable=False),
        sa.Column("infra_failures", sa.JSON, nullable=False),
        sa.Column("model_failures", sa.Integer, nullable=False),
        sa.Column("oracle_pass_rate", sa.Float, nullable=True),
        sa.Column("p50_episode_s", sa.Float, nullable=True),
        sa.Column("p95_episode_s", sa.Float, nullable=True),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_index("ix_health_reports_version_id", "health_reports", ["version_id"])


def downgrade() -> None:
    for table in ("health_reports", "versions", "blobs", "environments", "token_scopes", "tokens", "namespaces",
                  "users"):
        op.drop_table(table)
