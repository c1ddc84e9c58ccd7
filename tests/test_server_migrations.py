"""Issue 34's schema changes as Alembic migrations (0003: extensions, regrade requests,
each run's reason; 0004: trials; 0005: LTI 1.3): the models and the migrated database agree, and the
revisions go down and up again."""
from __future__ import annotations

import os

import pytest

if not os.environ.get("CI"):
    pytest.importorskip("alembic")
import sqlalchemy as sa  # noqa: E402
from alembic import command  # noqa: E402
from alembic.autogenerate import compare_metadata  # noqa: E402
from alembic.config import Config  # noqa: E402
from alembic.migration import MigrationContext  # noqa: E402

from harness.server import db  # noqa: E402
from tests.test_server_api import db_url, postgres  # noqa: E402,F401  (fixtures)


def test_models_match_the_migrated_schema_and_0003_0004_go_down_and_up(tmp_path, db_url):
    url = db_url
    db.upgrade(url)
    engine = db.engine_for(url)
    with engine.connect() as c:
        assert compare_metadata(MigrationContext.configure(c), db.Base.metadata) == []
    cfg = Config()
    cfg.set_main_option("script_location", str(db.MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", url)
    command.downgrade(cfg, "0002")
    names = set(sa.inspect(engine).get_table_names())
    assert not names & {"extensions", "regrade_requests", "trials"}
    assert "reason" not in {c["name"] for c in sa.inspect(engine).get_columns("jobs")}
    db.upgrade(url)
    assert {"extensions", "regrade_requests", "trials"} <= set(sa.inspect(engine).get_table_names())


def test_0005_lti_tables_go_down_and_up(tmp_path):
    url = f"sqlite:///{tmp_path / 'server.db'}"
    db.upgrade(url)
    lti = {"lti_users", "lti_sessions", "lti_links", "lti_posts", "lti_state"}
    engine = db.engine_for(url)
    assert lti <= set(sa.inspect(engine).get_table_names())
    cfg = Config()
    cfg.set_main_option("script_location", str(db.MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", url)
    command.downgrade(cfg, "0004")
    assert not lti & set(sa.inspect(engine).get_table_names())
    assert "trials" in set(sa.inspect(engine).get_table_names())
    db.upgrade(url)
    assert lti <= set(sa.inspect(engine).get_table_names())
