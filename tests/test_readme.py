"""The README, run top to bottom as a newcomer would run it (issue 19), so it cannot break
without a test failing.

What runs: every ```bash and ```python block, in the README's order, in one temporary folder,
against real servers; ```pbtxt blocks are parsed with Triton's ModelConfig schema; ```text
blocks are only read. A bash or python block is skipped only where the line above it says
`<!-- readme-test: skip: <why> -->` (today: installing the bench extra and running the
benchmarks for minutes; `oceanus tune` for 3 minutes, which tests/tune runs end to end; running
the test suite, which this test is part of, and the checks of this checkout that it runs).

What a test machine cannot do as a newcomer's does is substituted, the same way for every block:
- `pip ...` is not run: the test runs in the environment scripts/test.sh installed. Instead
  `test_pip_install_provides_the_examples_imports` checks that the README's pip lines (`pip
  install .`, then `.[llm]` and the openai client) bring every module its Python imports
  (tritonclient.http needs the [http] extra).
- `oceanus ...` starts in the background with `--http-port/--grpc-port/--metrics-port` on free
  loopback ports appended, and the block goes on once it is live; the next `oceanus` line stops
  the previous server first (the README starts each in its own terminal). `localhost:8000`,
  `:8001` and `:8002` become those ports.
- `python` is this interpreter; `curl` gets `--fail-with-body`, so a 4xx or 5xx fails the block.
- `scripts/perf_analyzer.sh` gets short, lenient windows appended (20 requests each, stability
  100 %, up to 10 trials), as tests/test_perf_analyzer.py runs it; without perf_analyzer
  installed (scripts/test.sh installs it) that block skips, saying so.
- A Python line `print(...)  # X` must print X.
"""

from __future__ import annotations

import ast
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from tests.conftest import free_port
from tests.test_perf_analyzer import PA_VENV

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SKIP = re.compile(r"<!--\s*readme-test:\s*skip:\s*(?P<why>.*?)\s*-->")
RUN = ("bash", "python")
PERF_FLAGS = (
    " --measurement-mode count_windows --measurement-request-count 20"
    " --stability-percentage 100 --max-trials 10"
)


@dataclass
class Block:
    line: int  # where its fence is, 1-based
    language: str
    text: str
    skip: str  # why it is not run ("" when it is)

    @property
    def name(self) -> str:
        return f"line{self.line}-{self.language}"


def readme_blocks(text: str) -> list[Block]:
    blocks: list[Block] = []
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        fence = re.match(r"^```(\w*)\s*$", lines[index])
        if fence is None:
            index += 1
            continue
        start = index
        index += 1
        body: list[str] = []
        while index < len(lines) and lines[index].rstrip() != "```":
            body.append(lines[index])
            index += 1
        previous = next((x for x in reversed(lines[:start]) if x.strip()), "")
        skip = SKIP.search(previous)
        language = fence.group(1) or "text"
        blocks.append(
            Block(start + 1, language, "\n".join(body) + "\n", skip["why"] if skip else "")
        )
        index += 1
    return blocks


BLOCKS = readme_blocks(README.read_text(encoding="utf-8"))


class ReadmeRun:
    """The newcomer's machine: one folder, one server at a time on free ports."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.ports = {8000: free_port(), 8001: free_port(), 8002: free_port()}
        self.env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }

    def substitute(self, text: str) -> str:
        for default, port in self.ports.items():
            text = text.replace(f"localhost:{default}", f"127.0.0.1:{port}")
        return text

    def preamble(self) -> str:
        http, grpc_port, metrics = self.ports.values()
        return f"""set -euo pipefail
cd {self.folder}
python() {{ {sys.executable} "$@"; }}
pip() {{ echo "readme-test: not run: pip $*"; }}
curl() {{ command curl --fail-with-body --silent --show-error "$@"; }}
bash() {{
  if [ "${{1:-}}" = scripts/perf_analyzer.sh ]; then
    shift; command bash {ROOT}/scripts/perf_analyzer.sh "$@"{PERF_FLAGS}
  elif [ "${{1:-}}" = scripts/install_perf_analyzer.sh ]; then
    shift; command bash {ROOT}/scripts/install_perf_analyzer.sh "$@"
  else
    command bash "$@"
  fi
}}
stop_server() {{
  [ -f server.pid ] || return 0
  pid=$(cat server.pid); rm server.pid
  kill "$pid" 2>/dev/null || return 0
  for _ in $(seq 1 600); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  kill -9 "$pid"
}}
oceanus() {{
  stop_server
  echo "readme-test: oceanus $* (in the background)" >> server.log
  {sys.executable} -m oceanus "$@" --http-port={http} --grpc-port={grpc_port} \\
    --metrics-port={metrics} --http-address=127.0.0.1 --grpc-address=127.0.0.1 \\
    --metrics-address=127.0.0.1 >> server.log 2>&1 < /dev/null &
  echo $! > server.pid
  for _ in $(seq 1 1200); do
    if command curl -sf http://127.0.0.1:{http}/v2/health/live > /dev/null; then return 0; fi
    if ! kill -0 "$(cat server.pid)" 2>/dev/null; then
      echo "oceanus $* exited:"; tail -40 server.log; return 1
    fi
    sleep 0.25
  done
  echo "oceanus $* was not live after 300 s"; tail -40 server.log; return 1
}}
"""

    def run_bash(self, block: Block) -> subprocess.CompletedProcess[str]:
        script = self.preamble() + self.substitute(block.text)
        return subprocess.run(
            ["bash", "-c", script],
            capture_output=True,
            text=True,
            env=self.env,
            stdin=subprocess.DEVNULL,
            timeout=900,
        )

    def run_python(self, block: Block) -> subprocess.CompletedProcess[str]:
        path = self.folder / f"readme_{block.line}.py"
        path.write_text(self.substitute(block.text), encoding="utf-8")
        return subprocess.run(
            [sys.executable, str(path)],
            capture_output=True,
            text=True,
            env=self.env,
            cwd=self.folder,
            timeout=300,
        )

    def stop(self) -> None:
        pid_file = self.folder / "server.pid"
        if not pid_file.exists():
            return
        pid = int(pid_file.read_text())
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)
        os.kill(pid, signal.SIGKILL)

    def log(self) -> str:
        path = self.folder / "server.log"
        return path.read_text(errors="replace")[-6000:] if path.exists() else ""


@pytest.fixture(scope="module")
def readme_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReadmeRun]:
    run = ReadmeRun(tmp_path_factory.mktemp("newcomer"))
    yield run
    run.stop()


def test_readme_says_what_is_run_and_what_is_not() -> None:
    run = [b for b in BLOCKS if b.language in RUN and not b.skip]
    assert {b.language for b in run} == {"bash", "python"}
    assert len(run) >= 8
    unknown = [b.name for b in BLOCKS if b.language not in (*RUN, "pbtxt", "text")]
    assert not unknown, f"blocks in a language this test does not know: {unknown}"
    assert all(b.language in RUN for b in BLOCKS if b.skip), "only runnable blocks can be skipped"
    # The first command installs; the second starts the server everything after it talks to.
    first = next(b for b in BLOCKS if b.language == "bash")
    commands = [x.split("#")[0].strip() for x in first.text.splitlines() if x.strip()]
    assert commands[:2] == ["pip install .", "oceanus"]


def test_readme_links_exist() -> None:
    text = README.read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)#:\s]+)(?:#[^)]*)?\)", text)
    assert targets
    missing = [t for t in targets if not (ROOT / t).exists()]
    assert not missing


@pytest.mark.parametrize("block", BLOCKS, ids=[b.name for b in BLOCKS])
def test_readme_block(readme_run: ReadmeRun, block: Block) -> None:
    if block.skip:
        pytest.skip(f"README says: {block.skip}")
    if block.language == "text":
        return
    if block.language == "pbtxt":
        text_format.Parse(block.text, mc.ModelConfig())
        return
    if (
        "scripts/perf_analyzer.sh " in block.text
        and not (PA_VENV / "bin" / "perf_analyzer").exists()
    ):
        pytest.skip(
            f"perf_analyzer is not installed in {PA_VENV}: bash scripts/install_perf_analyzer.sh"
        )
    run = readme_run.run_bash if block.language == "bash" else readme_run.run_python
    result = run(block)
    report = f"{result.stdout}\n{result.stderr}\n--- server log ---\n{readme_run.log()}"
    assert result.returncode == 0, report
    if block.language == "python":
        expected = re.findall(r"^\s*print\(.*\)\s*#\s*(.+?)\s*$", block.text, re.M)
        printed = result.stdout.splitlines()
        assert printed[-len(expected) :] == expected, report


def _imports(source: str) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_pip_install_provides_the_examples_imports() -> None:
    """What the README's pip lines install covers what its Python blocks import."""
    tomllib = pytest.importorskip("tomllib")
    from importlib.metadata import packages_distributions

    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    # What the README's pip lines install: the project ('.', with the extras named) and any
    # package named beside it (`pip install '.[llm]' openai`).
    installed = list(project["dependencies"])
    for block in BLOCKS:
        for line in block.text.splitlines() if block.language == "bash" else []:
            words = line.split("#")[0].replace("'", "").split()
            if words[:2] != ["pip", "install"]:
                continue
            for word in words[2:]:
                if word.startswith("."):
                    extras = word.partition("[")[2].rstrip("]")
                    for extra in filter(None, extras.split(",")):
                        installed += project["optional-dependencies"][extra]
                elif not word.startswith("-"):
                    installed.append(word)
    requirements = {Requirement(r).name.lower(): Requirement(r) for r in installed}
    providers = packages_distributions()
    imported = set().union(*(_imports(b.text) for b in BLOCKS if b.language == "python"))
    assert "tritonclient.http" in imported
    for module in sorted(imported):
        top = module.split(".")[0]
        distributions = [d.lower() for d in providers.get(top, [])]
        assert any(d in requirements for d in distributions), f"{module}: not a dependency"
        if top == "tritonclient" and "." in module:
            extras = requirements["tritonclient"].extras
            extra = module.split(".")[1]
            assert extra in extras or "all" in extras, f"{module} needs tritonclient[{extra}]"
