"""late-day extensions, regrade requests, and why each run was made (issue 34)

Revision ID: 0003
Revises: 0002

``extensions``: a student's deadline of one lab moved by staff (``labs extend``).
``regrade_requests``: a student's request, the staff's answer and the regrade job it
queued. ``jobs.reason``: why a run was made ("" for the submission's own grading, else
the regrade's reason), so every result of a submission is kept and explained.
"""
import sqlalchemy as sa
from alembic import op

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('extensions',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('account_id', sa.Integer(), nullable=False),
    sa.Column('lab', sa.String(length=2), nullable=False),
    sa.Column('days', sa.Float(), nullable=False),
    sa.Column('reason', sa.Text(), nullable=False),
    sa.Column('created_by', sa.String(length=200), nullable=False),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.ForeignKeyConstraint(['account_id'], ['accounts.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index(op.f('ix_extensions_account_id'), 'extensions', ['account_id'], unique=False)
    op.create_table('regrade_requests',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('submission_id', sa.String(length=32), nullable=False),
    sa.Column('account_id', sa.Integer(), nullable=False),
    sa.Column('reason', sa.Text(), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('answer', sa.Text(), nullable=False),
    sa.Column('answered_by', sa.String(length=200), nullable=False),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.Column('answered_at', sa.Float(), nullable=True),
    sa.Column('job_id', sa.Integer(), nullable=True),
    sa.ForeignKeyConstraint(['account_id'], ['accounts.id'], ),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], ),
    sa.ForeignKeyConstraint(['submission_id'], ['submissions.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index(op.f('ix_regrade_requests_account_id'), 'regrade_requests', ['account_id'], unique=False)
    op.create_index(op.f('ix_regrade_requests_state'), 'regrade_requests', ['state'], unique=False)
    op.create_index(op.f('ix_regrade_requests_submission_id'), 'regrade_requests', ['submission_id'], unique=False)
    with op.batch_alter_table('jobs') as batch:
        batch.add_column(sa.Column('reason', sa.Text(), nullable=False, server_default=''))


def downgrade() -> None:
    with op.batch_alter_table('jobs') as batch:
        batch.drop_column('reason')
    op.drop_index(op.f('ix_regrade_requests_submission_id'), table_name='regrade_requests')
    op.drop_index(op.f('ix_regrade_requests_state'), table_name='regrade_requests')
    op.drop_index(op.f('ix_regrade_requests_account_id'), table_name='regrade_requests')
    op.drop_table('regrade_requests')
    op.drop_index(op.f('ix_extensions_account_id'), table_name='extensions')
    op.drop_table('extensions')
