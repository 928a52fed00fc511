from envkit_check import run

DATA = "region,kind,amount\nEU,a,10\nUS,a,5\nEU,b,2.5\nEU,a,1\n"


def csvtool(*args):
    return run(["python3", "-m", "kit.csvtool", "data.csv", *args], files={"data.csv": DATA})


def test_single_filter():
    r = csvtool("--sum", "amount", "--where", "region=EU")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "13.5"


def test_two_filters_all_must_match():
    r = csvtool("--sum", "amount", "--where", "region=EU", "--where", "kind=a")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "11"


def test_no_match_sums_to_zero():
    r = csvtool("--sum", "amount", "--where", "region=APAC")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "0"


def test_unknown_filter_column():
    r = csvtool("--sum", "amount", "--where", "country=EU")
    assert r.returncode == 2
    assert "no column 'country'" in r.stderr


def test_malformed_filter():
    r = csvtool("--sum", "amount", "--where", "regionEU")
    assert r.returncode == 2
    assert "COLUMN=VALUE" in r.stderr
