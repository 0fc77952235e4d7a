#!/usr/bin/env python3
"""Prints why each skipped ctest test was skipped, from ctest's JUnit report (ctest --output-junit).

ctest's own summary names a skipped test ("did not run ... (Skipped)") but not its reason, which the
test printed (a line starting "skip", by this project's convention: netns_test.skip, vm-test.sh).

  skip-reasons.py REPORT.xml
"""
import sys
import xml.etree.ElementTree as ET


def main():
    if len(sys.argv) != 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    try:
        cases = ET.parse(sys.argv[1]).getroot().iter("testcase")
    except (OSError, ET.ParseError) as e:
        print(f"skip-reasons: cannot read {sys.argv[1]}: {e}", file=sys.stderr)
        return 1
    n = 0
    for tc in cases:
        if tc.get("status") != "notrun" and tc.find("skipped") is None:
            continue
        out = (tc.findtext("system-out") or "").splitlines()
        why = [line.strip() for line in out if line.lower().startswith("skip")] or out[-1:] or ["(it printed nothing)"]
        print(f"skipped: {tc.get('name')}: {' / '.join(why)}")
        n += 1
    print(f"{n} test(s) skipped" + (", each with its reason above" if n else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
