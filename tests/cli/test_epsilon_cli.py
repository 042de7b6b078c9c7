"""``sqldp epsilon`` end to end (subprocess): JSON fields, the PNG plot, the cost model, one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sqldp.datasets import dataset_path


def sqldp(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sqldp.cli", "epsilon", *args], capture_output=True, text=True, timeout=120
    )


def ok(*args: str) -> dict:
    r = sqldp(*args, "--format", "json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_epsilon_for_a_target_inline_discrete() -> None:
    out = ok("--prior", "set_uniform:4", "--advantage", "0.1")  # E13: p = 0.25 → 0.479573
    assert out["mode"] == "epsilon" and out["epsilon"] == pytest.approx(0.479573, abs=1e-6)
    (g,) = out["goals"]
    assert g["prior"] == pytest.approx(0.25) and g["bound"] == "ε_lb" and g["diameter"] == 1


def test_or_of_two_attributes_and_the_inverse() -> None:
    out = ok("--prior", "set_uniform:2", "--prior", "set_uniform:2", "--combine", "or", "--advantage", "0.1")
    assert out["epsilon"] == pytest.approx(0.479573, abs=1e-6)  # E5 OR: prior 0.75
    back = ok(
        "--prior", "set_uniform:2", "--prior", "set_uniform:2", "--combine", "or", "--epsilon", str(out["epsilon"])
    )
    assert back["mode"] == "advantage" and back["advantage"] == pytest.approx(0.1, abs=1e-6)


def test_membership_worst_case() -> None:
    assert ok("--membership", "unknown", "--advantage", "0.1")["epsilon"] == pytest.approx(0.4013414, abs=1e-7)


def test_policy_goals() -> None:
    out = ok("--policy", str(dataset_path("cafeteria.toml")), "--advantage", "0.05")
    assert out["epsilon"] > 0 and out["goals"][0]["goal"] == "t.time ±2" and out["goals"][0]["diameter"] == 2


def test_cost_model_health_centre() -> None:
    out = ok("--cost-per-person", "5500", "--people", "100", "--epsilon0", "0.5")
    assert out["cost"]["budget"] == pytest.approx(74434.40, abs=0.01)
    assert out["cost"]["epsilon_min"] == pytest.approx(0.274, abs=5e-4)
    assert out["cost"]["budget_min"] == pytest.approx(37805.86, abs=0.01)
    r = sqldp("--cost-per-person", "5500", "--people", "100", "--epsilon0", "0.5")
    assert r.returncode == 0 and "74434.41" in r.stdout


def test_risk_pairs_for_the_derived_epsilon() -> None:
    out = ok("--prior", "set_uniform:4", "--advantage", "0.1", "--risk", "--outputs", "2")
    risk = out["privacy_at_risk"]
    assert risk["epsilon0"] == pytest.approx(out["epsilon"]) and risk["outputs"] == 2
    eps = [p["epsilon"] for p in risk["pairs"]]
    assert eps == sorted(eps) and all(0 < e < out["epsilon"] for e in eps)


def test_plot_is_a_png(tmp_path: Path) -> None:
    png = tmp_path / "fig.png"
    out = ok("--prior", "range_uniform:0:60", "--radius", "2", "--advantage", "0.05", "--plot", str(png))
    assert out["plot"] == str(png)
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    assert [p.name for p in tmp_path.iterdir()] == ["fig.png"]  # no temp file left behind


@pytest.mark.parametrize(("suffix", "magic"), [("svg", b"<?xml"), ("pdf", b"%PDF")])
def test_plot_as_svg_or_pdf_is_readable_by_others_and_marks_the_chosen_epsilon(
    tmp_path: Path, suffix: str, magic: bytes
) -> None:
    """The figure is written in the suffix's format with the permissions of any new file (not mkstemp's
    0600), and names the goal, the target and the chosen ε, on the axis the text uses (ε at the goal's R)."""
    figure = tmp_path / f"fig.{suffix}"
    out = ok("--prior", "range_uniform:0:60", "--radius", "2", "--advantage", "0.05", "--plot", str(figure))
    data = figure.read_bytes()
    assert data.startswith(magic)
    umask = os.umask(0)
    os.umask(umask)
    assert figure.stat().st_mode & 0o777 == 0o666 & ~umask
    if suffix == "svg":
        text = data.decode()
        assert f"chosen ε = {out['epsilon']:.4g}" in text and "target advantage 0.05" in text
        assert "goal: " in text and f"R = {out['goals'][0]['diameter']:g}" in text


def test_bad_plot_path_leaves_nothing(tmp_path: Path) -> None:
    r = sqldp("--prior", "set_uniform:3", "--advantage", "0.1", "--plot", str(tmp_path / "fig.jpg"))
    assert r.returncode == 2 and "--plot" in r.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("args", "where"),
    [
        (["--prior", "bogus", "--advantage", "0.1"], "--prior"),
        (["--prior", "set_uniform:3", "--advantage", "1.5"], "--advantage"),
        (["--prior", "range_uniform:0:60", "--advantage", "0.1"], "--radius"),
        (["--prior", "range_uniform:0:60", "--radius", "-2", "--advantage", "0.1"], "--radius"),
        (["--prior", "set_uniform:3", "--advantage", "0.1", "--epsilon", "1"], "epsilon"),
        (["--membership", "2", "--advantage", "0.1"], "--membership"),
        (["--cost-per-person", "5500", "--epsilon0", "0.5"], "--people"),
        (["--advantage", "0.1"], "--prior"),
        (["--policy", "/nonexistent/p.toml", "--advantage", "0.1"], "p.toml"),
        (["--combine", "xor"], "--combine"),
    ],
)
def test_bad_flags_one_line_exit_2(args: list[str], where: str) -> None:
    r = sqldp(*args)
    assert r.returncode == 2, r.stdout
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr
    assert where in lines[0]
