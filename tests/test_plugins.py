"""Policies of your own, registered by modules named in ``$MEMTP_SIM_PLUGINS``: a command's process
and the workers it spawns import them when they meet a policy name they do not know."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from memtp_sim.errors import InvalidArgumentError
from memtp_sim.policies import registry

REPO = Path(__file__).resolve().parents[1]

PLUGIN = '''
from memtp_sim.policies import register
from memtp_sim.policies.static import StaticPolicy


@register("my_plugin_policy")
class MyPolicy(StaticPolicy):
    """Verifies k drafts, as static."""
'''


def test_a_plugin_module_registers_its_policy_in_a_fresh_process(tmp_path):
    (tmp_path / "my_plugin.py").write_text(PLUGIN)
    code = ("from memtp_sim.policies import available_policies, make_policy\n"
            "print('my_plugin_policy' in available_policies(), type(make_policy('my_plugin_policy', {'k': 2})).__name__)")
    env = {"PYTHONPATH": f"{tmp_path}:{REPO}", "MEMTP_SIM_PLUGINS": " my_plugin , ", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "MyPolicy"]


def test_without_the_variable_the_name_is_unknown_and_the_error_lists_the_choices(tmp_path, monkeypatch):
    monkeypatch.delenv(registry.PLUGINS_ENV, raising=False)
    with pytest.raises(InvalidArgumentError, match=r"unknown policy 'no_such_policy'; choose one of: .*dspark"):
        registry.policy_class("no_such_policy")


def test_a_module_that_cannot_be_imported_is_a_one_line_error_naming_it_and_the_variable(monkeypatch):
    monkeypatch.setenv(registry.PLUGINS_ENV, "no_such_module_xyz")
    with pytest.raises(InvalidArgumentError) as err:
        registry.policy_class("no_such_policy")
    msg = str(err.value)
    assert "$MEMTP_SIM_PLUGINS" in msg and "'no_such_module_xyz'" in msg and "\n" not in msg


HALF = '''
from memtp_sim.policies import register
from memtp_sim.policies.static import StaticPolicy


@register("half_plugin_policy")
class HalfPolicy(StaticPolicy):
    """Registered before the module fails."""


raise ValueError("the plugin's own bug\\nsecond line")
'''


def test_a_plugin_that_fails_after_registering_gives_the_same_one_line_error_every_time(tmp_path):
    # review: the failed module was imported again on the next lookup, which then said its policy
    # was "already registered", and the one after that handed out the half-imported class
    (tmp_path / "half_plugin.py").write_text(HALF)
    code = ("from memtp_sim.policies import policy_class\n"
            "from memtp_sim.errors import InvalidArgumentError\n"
            "for _ in range(3):\n"
            "    try:\n"
            "        policy_class('half_plugin_policy')\n"
            "        print('FOUND')\n"
            "    except InvalidArgumentError as e:\n"
            "        print(str(e))\n")
    env = {"PYTHONPATH": f"{tmp_path}:{REPO}", "MEMTP_SIM_PLUGINS": "half_plugin", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 3 and len(set(lines)) == 1, lines
    assert "'half_plugin'" in lines[0] and "ValueError: the plugin's own bug" in lines[0]
