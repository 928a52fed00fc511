import subprocess
import sys

DATA = "region,kind,amount\nEU,a,10\nUS,a,5\nEU,b,2.5\nEU,a,1\n"


def run(tmp_path, *args):
    f = tmp_path / "data.csv"
    f.write_text(DATA)
    return subprocess.run([sys.executable, "-m", "kit.csvtool", str(f), *args],
                          capture_output=True, text=True, cwd="/workspace", timeout=30)


def test_single_filter(tmp_path):
    r = run(tmp_path, "--sum", "amount", "--where", "region=EU")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "13.5"


def test_two_filters_all_must_match(tmp_path):
    r = run(tmp_path, "--sum", "amount", "--where", "region=EU", "--where", "kind=a")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "11"


def test_no_match_sums_to_zero(tmp_path):
    r = run(tmp_path, "--sum", "amount", "--where", "region=APAC")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "0"


def test_unknown_filter_column(tmp_path):
    r = run(tmp_path, "--sum", "amount", "--where", "country=EU")
    assert r.returncode == 2
    assert "no column 'country'" in r.stderr


def test_malformed_filter(tmp_path):
    r = run(tmp_path, "--sum", "amount", "--where", "regionEU")
    assert r.returncode == 2
    assert "COLUMN=VALUE" in r.stderr
