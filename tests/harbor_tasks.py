"""A set of Harbor-format task folders written by the tests themselves (no download): each
Dockerfile starts FROM an image that cannot be pulled here (mapped to the local envkit base
with --base-map), and together they cover what `envkit import harbor` must carry over."""

from __future__ import annotations

from pathlib import Path

# FROM names used below; the tests map each to the local base image.
UNPULLABLE = ("python:3.12-slim", "ubuntu:24.04", "alpine:3.20")

_REWARD_TXT = """#!/bin/bash
if {check}; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
"""


def _task(root: Path, name: str, *, toml: str, instruction: str, dockerfile: str | None, test: str, solve: str,
          extra: dict[str, str] | None = None) -> Path:
    d = root / name
    (d / "tests").mkdir(parents=True)
    (d / "solution").mkdir()
    (d / "environment").mkdir()
    (d / "task.toml").write_text(toml)
    (d / "instruction.md").write_text(instruction + "\n")
    if dockerfile is not None:
        (d / "environment" / "Dockerfile").write_text(dockerfile)
    (d / "tests" / "test.sh").write_text(test)
    (d / "tests" / "test.sh").chmod(0o755)
    (d / "solution" / "solve.sh").write_text("#!/bin/bash\nset -e\n" + solve)
    for rel, text in (extra or {}).items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_text(text)
    return d


def write_harbor_tasks(root: Path) -> list[Path]:
    """Ten Harbor tasks under ``root``; returns their folders."""
    root.mkdir(parents=True, exist_ok=True)
    app = "FROM python:3.12-slim\nWORKDIR /app\n"
    tasks = [
        _task(root, "hello-file", toml='version = "1.0"\n[metadata]\ndifficulty = "easy"\ncategory = "file-ops"\n'
              'tags = ["basics"]\n[verifier]\ntimeout_sec = 60.0\n[agent]\ntimeout_sec = 120.0\n',
              instruction="Create /app/hello.txt containing exactly `Hello, world!`.", dockerfile=app,
              test=_REWARD_TXT.format(check='[ "$(cat /app/hello.txt 2>/dev/null)" = "Hello, world!" ]'),
              solve="echo 'Hello, world!' > /app/hello.txt\n"),
        _task(root, "Fix_Calc", toml='version = "1.0"\n[metadata]\ndifficulty = "medium"\n'
              '[verifier]\ntimeout_sec = 60.0\n',
              instruction="calc.py's add() subtracts. Fix it so add(2, 3) == 5.",
              dockerfile=app + "COPY calc.py /app/calc.py\n",
              test=_REWARD_TXT.format(check="cd /app && python3 -c 'import calc; assert calc.add(2, 3) == 5'"),
              solve="sed -i 's/a - b/a + b/' /app/calc.py\n",
              extra={"environment/calc.py": "def add(a, b):\n    return a - b\n"}),
        _task(root, "multi-reward", toml='[metadata]\ndifficulty = "hard"\n[verifier]\ntimeout_sec = 60.0\n',
              instruction="Write /app/report.json with keys `total` (= 10) and `items` (a list of 4 strings).",
              dockerfile=app,
              test="#!/bin/bash\npython3 - <<'PY'\nimport json\n"
                   "try:\n    r = json.load(open('/app/report.json'))\nexcept Exception:\n"
                   "    r = {}\nc = 1.0 if r.get('total') == 10 else 0.0\nitems = r.get('items')\n"
                   "s = 1.0 if isinstance(items, list) and len(items) == 4 "
                   "and all(isinstance(i, str) for i in items) else 0.0\n"
                   "json.dump({'correctness': c, 'shape': s}, open('/logs/verifier/reward.json', 'w'))\nPY\n",
              solve="echo '{\"total\": 10, \"items\": [\"a\", \"b\", \"c\", \"d\"]}' > /app/report.json\n"),
        _task(root, "slow-agent", toml='[verifier]\ntimeout_sec = 30.0\n[agent]\ntimeout_sec = 4.0\n',
              instruction="Create /app/done quickly: you have four seconds.", dockerfile=app,
              test=_REWARD_TXT.format(check="[ -f /app/done ]"), solve="touch /app/done\n"),
        _task(root, "verifier-env", toml='[verifier]\ntimeout_sec = 60.0\nenv = { EXPECTED = "42" }\n',
              instruction="Write the answer to life, the universe and everything to /app/answer.txt.", dockerfile=app,
              test=_REWARD_TXT.format(check='[ "$(cat /app/answer.txt 2>/dev/null)" = "$EXPECTED" ]'),
              solve="echo 42 > /app/answer.txt\n"),
        _task(root, "prebuilt-image", toml='[environment]\ndocker_image = "alpine:3.20"\n'
              '[verifier]\ntimeout_sec = 60.0\n',
              instruction="Write `ok` to /srv/out.txt.", dockerfile=None,
              test=_REWARD_TXT.format(check='[ "$(cat /srv/out.txt 2>/dev/null)" = ok ]'),
              solve="mkdir -p /srv && echo ok > /srv/out.txt\n"),
        _task(root, "sum-numbers", toml='[environment]\ncpus = 1\nmemory = "512M"\nallow_internet = false\n'
              'build_timeout_sec = 300.0\n[verifier]\ntimeout_sec = 60.0\n',
              instruction="/app/data.txt holds one integer per line. Write their sum to /app/sum.txt.",
              dockerfile="FROM ubuntu:24.04\nWORKDIR /app\nRUN seq 1 100 > /app/data.txt\n",
              test=_REWARD_TXT.format(check='[ "$(cat /app/sum.txt 2>/dev/null)" = 5050 ]'),
              solve="python3 -c \"print(sum(int(x) for x in open('/app/data.txt')))\" > /app/sum.txt\n"),
        _task(root, "with-extras", toml='custom_top = "x"\n[environment]\nstorage_mb = 10240\ngpus = 0\n'
              '[solution]\nenv = { HINT = "1" }\n[verifier]\ntimeout_sec = 60.0\n',
              instruction="Uppercase /app/words.txt in place.",
              dockerfile=app + "RUN printf 'alpha\\nbeta\\n' > /app/words.txt\n",
              test=_REWARD_TXT.format(check='[ "$(cat /app/words.txt)" = "$(printf \'ALPHA\\nBETA\')" ]'),
              solve="tr a-z A-Z < /app/words.txt > /tmp/w && cat /tmp/w > /app/words.txt\n",
              extra={"environment/docker-compose.yaml":
                     "services:\n  main:\n    build: .\n  db:\n    image: postgres:16\n"}),
        _task(root, "pytest-style", toml='[verifier]\ntimeout_sec = 120.0\n',
              instruction="Write a function `is_prime(n)` in /app/primes.py.", dockerfile=app,
              test="#!/bin/bash\ncd /tests && python3 -m pytest -q -p no:cacheprovider test_outputs.py\n"
                   "if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; "
                   "else echo 0 > /logs/verifier/reward.txt; fi\n",
              solve="cat > /app/primes.py <<'PY'\ndef is_prime(n):\n"
                    "    return n > 1 and all(n % d for d in range(2, int(n ** 0.5) + 1))\nPY\n",
              extra={"tests/test_outputs.py": "import sys\nsys.path.insert(0, '/app')\n\n\n"
                                              "def test_primes():\n    from primes import is_prime\n"
                                              "    assert [n for n in range(20) if is_prime(n)] == "
                                              "[2, 3, 5, 7, 11, 13, 17, 19]\n"}),
        _task(root, "as-agent-user", toml='[agent]\nuser = "agent"\ntimeout_sec = 60.0\n'
              '[verifier]\ntimeout_sec = 60.0\n',
              instruction="As the agent user, create /app/mine.txt.",
              dockerfile=app + "RUN chown 1000:1000 /app\n",
              test=_REWARD_TXT.format(check='[ "$(stat -c %u /app/mine.txt 2>/dev/null)" = 1000 ]'),
              solve="touch /app/mine.txt\n"),
    ]
    return tasks
