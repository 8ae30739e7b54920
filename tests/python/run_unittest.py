"""Runs one unittest file for ctest: exit 0 when its tests pass, 1 when one
fails, and 77 (ctest's SKIP_RETURN_CODE) when every test was skipped, e.g.
for want of torch, so that the summary shows a skip and not a pass."""

import os
import sys
import unittest


def main():
    path = os.path.abspath(sys.argv[1])
    sys.path.insert(0, os.path.dirname(path))
    module = os.path.splitext(os.path.basename(path))[0]
    suite = unittest.defaultTestLoader.loadTestsFromName(module)
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    if not result.wasSuccessful():
        return 1
    if result.testsRun > 0 and len(result.skipped) == result.testsRun:
        return 77
    return 0


if __name__ == "__main__":
    sys.exit(main())
