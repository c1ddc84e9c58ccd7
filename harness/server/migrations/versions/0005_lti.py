"""LTI 1.3 (issue 34.1b): platform users, launch sessions, line items, grade posts, launch state

Revision ID: 0005
Revises: 0004

``lti_users``: a platform user (issuer + sub) and the course account it launches as.
``lti_sessions``: the login cookie's token of a launch. ``lti_links``: the line item a
student's grade of a lab goes to. ``lti_posts``: each grade to post, pending until the
platform took it. ``lti_state``: pylti1p3's state and nonces between login and launch.
"""
import sqlalchemy as sa
from alembic import op

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('lti_users',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('issuer', sa.String(length=500), nullable=False),
    sa.Column('sub', sa.String(length=255), nullable=False),
    sa.Column('account_id', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.ForeignKeyConstraint(['account_id'], ['accounts.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('issuer', 'sub', name='one_account_per_lti_user')
    )
    op.create_index(op.f('ix_lti_users_account_id'), 'lti_users', ['account_id'], unique=False)
    op.create_table('lti_sessions',
    sa.Column('token_hash', sa.String(length=64), nullable=False),
    sa.Column('account_id', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.Column('expires_at', sa.Float(), nullable=False),
    sa.ForeignKeyConstraint(['account_id'], ['accounts.id'], ),
    sa.PrimaryKeyConstraint('token_hash')
    )
    op.create_index(op.f('ix_lti_sessions_account_id'), 'lti_sessions', ['account_id'], unique=False)
    op.create_table('lti_links',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('account_id', sa.Integer(), nullable=False),
    sa.Column('lab', sa.String(length=2), nullable=False),
    sa.Column('issuer', sa.String(length=500), nullable=False),
    sa.Column('client_id', sa.String(length=255), nullable=False),
    sa.Column('deployment_id', sa.String(length=255), nullable=False),
    sa.Column('sub', sa.String(length=255), nullable=False),
    sa.Column('ags', sa.Text(), nullable=False),
    sa.Column('updated_at', sa.Float(), nullable=False),
    sa.ForeignKeyConstraint(['account_id'], ['accounts.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('account_id', 'lab', name='one_line_item_per_student_lab')
    )
    op.create_index(op.f('ix_lti_links_account_id'), 'lti_links', ['account_id'], unique=False)
    op.create_table('lti_posts',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('result_id', sa.Integer(), nullable=False),
    sa.Column('link_id', sa.Integer(), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('score', sa.Float(), nullable=True),
    sa.Column('max_score', sa.Float(), nullable=True),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('error', sa.Text(), nullable=False),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.Column('next_try', sa.Float(), nullable=False),
    sa.Column('sent_at', sa.Float(), nullable=True),
    sa.ForeignKeyConstraint(['link_id'], ['lti_links.id'], ),
    sa.ForeignKeyConstraint(['result_id'], ['results.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index(op.f('ix_lti_posts_link_id'), 'lti_posts', ['link_id'], unique=False)
    op.create_index(op.f('ix_lti_posts_result_id'), 'lti_posts', ['result_id'], unique=False)
    op.create_index(op.f('ix_lti_posts_state'), 'lti_posts', ['state'], unique=False)
    op.create_table('lti_state',
    sa.Column('key', sa.String(length=255), nullable=False),
    sa.Column('value', sa.Text(), nullable=False),
    sa.Column('expires_at', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('key')
    )


def downgrade() -> None:
    op.drop_table('lti_state')
    op.drop_index(op.f('ix_lti_posts_state'), table_name='lti_posts')
    op.drop_index(op.f('ix_lti_posts_result_id'), table_name='lti_posts')
    op.drop_index(op.f('ix_lti_posts_link_id'), table_name='lti_posts')
    op.drop_table('lti_posts')
    op.drop_index(op.f('ix_lti_links_account_id'), table_name='lti_links')
    op.drop_table('lti_links')
    op.drop_index(op.f('ix_lti_sessions_account_id'), table_name='lti_sessions')
    op.drop_table('lti_sessions')
    op.drop_index(op.f('ix_lti_users_account_id'), table_name='lti_users')
    op.drop_table('lti_users')
