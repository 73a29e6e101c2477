from pathlib import Path

import pytest
from pydantic import ValidationError

from mathagent.config import Settings


def test_defaults(clean_env):
    s = Settings()
    assert s.base_url is None
    assert s.sandbox_url is None
    assert s.api_key is None
    assert s.host == "127.0.0.1"
    assert s.sandbox.timeout_s == 10.0
    assert s.sandbox.max_output_chars == 1000
    assert s.agent.max_tool_calls is None  # the model family's (8 for OpenMath-Nemotron)
    assert s.agent.recipe == "none" and s.agent.max_tokens is None
    assert s.model_dir == s.cache_dir / "models"


def test_contract_env_vars(clean_env):
    clean_env.setenv("MATHAGENT_BASE_URL", "http://127.0.0.1:8000/v1")
    clean_env.setenv("MATHAGENT_MODEL", "my-model")
    clean_env.setenv("MATHAGENT_SANDBOX_URL", "http://127.0.0.1:6000")
    clean_env.setenv("MATHAGENT_API_KEY", "secret")
    s = Settings()
    assert s.base_url == "http://127.0.0.1:8000/v1"
    assert s.model == "my-model"
    assert s.sandbox_url == "http://127.0.0.1:6000"
    assert s.api_key == "secret"


def test_nested_sections_from_env(clean_env, tmp_path: Path):
    clean_env.setenv("MATHAGENT_SANDBOX__POOL_SIZE", "7")
    clean_env.setenv("MATHAGENT_ENGINE__MAX_BATCH_SIZE", "16")
    clean_env.setenv("MATHAGENT_AGENT__MAX_TOOL_CALLS", "6")
    clean_env.setenv("MATHAGENT_AGENT__RECIPE", "aimo2")
    clean_env.setenv("MATHAGENT_AGENT__REASONING_EFFORT", "medium")
    clean_env.setenv("MATHAGENT_CACHE_DIR", str(tmp_path))
    s = Settings()
    assert s.sandbox.pool_size == 7
    assert s.engine.max_batch_size == 16
    assert s.agent.max_tool_calls == 6
    assert (s.agent.recipe, s.agent.reasoning_effort) == ("aimo2", "medium")
    assert s.model_dir == tmp_path / "models"


def test_bad_values_are_rejected(clean_env):
    clean_env.setenv("MATHAGENT_SANDBOX__POOL_SIZE", "-1")
    with pytest.raises(ValidationError):
        Settings()


def test_base_url_takes_one_endpoint_or_a_comma_list_of_replicas(clean_env):
    from pydantic import ValidationError

    from mathagent.config import Settings

    clean_env.setenv("MATHAGENT_BASE_URL", "http://a:8000/v1")
    assert Settings().base_urls == ["http://a:8000/v1"]
    clean_env.setenv("MATHAGENT_BASE_URL", "http://a:8000/v1, http://b:8001/v1,")
    assert Settings().base_urls == ["http://a:8000/v1", "http://b:8001/v1"]
    clean_env.setenv("MATHAGENT_BASE_URL", " , ")
    with pytest.raises(ValidationError, match="lists no URL"):
        Settings()
