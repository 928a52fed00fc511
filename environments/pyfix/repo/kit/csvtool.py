"""Command-line CSV summaries: python3 -m kit.csvtool FILE --sum COLUMN"""

import argparse
import csv
import sys


def column_sum(rows, column: str) -> float:
    return sum(float(row[column]) for row in rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="csvtool")
    parser.add_argument("file")
    parser.add_argument("--sum", dest="column", required=True, help="column to add up")
    args = parser.parse_args(argv)
    with open(args.file, newline="") as f:
        rows = list(csv.DictReader(f))
    if rows and args.column not in rows[0]:
        print(f"csvtool: no column {args.column!r}", file=sys.stderr)
        return 2
    total = column_sum(rows, args.column)
    print(f"{total:g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
