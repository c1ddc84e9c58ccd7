"""trial runs: the visible and perf tests on the grading hardware, never a submission (issue 34.5)

Revision ID: 0004
Revises: 0003
"""
import sqlalchemy as sa
from alembic import op

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('trials',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('account_id', sa.Integer(), nullable=False),
    sa.Column('lab', sa.String(length=2), nullable=False),
    sa.Column('blob', sa.LargeBinary(), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('owner', sa.String(length=200), nullable=True),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.Column('started_at', sa.Float(), nullable=True),
    sa.Column('finished_at', sa.Float(), nullable=True),
    sa.Column('result', sa.Text(), nullable=False),
    sa.Column('error', sa.Text(), nullable=False),
    sa.ForeignKeyConstraint(['account_id'], ['accounts.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index(op.f('ix_trials_account_id'), 'trials', ['account_id'], unique=False)
    op.create_index(op.f('ix_trials_state'), 'trials', ['state'], unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_trials_state'), table_name='trials')
    op.drop_index(op.f('ix_trials_account_id'), table_name='trials')
    op.drop_table('trials')
