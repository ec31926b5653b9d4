"""A rowclaim job handler in Python: `rowclaim work --queue mail -- python handler.py`.

rowclaim runs it once per job: the job's payload as JSON on stdin, its id, kind, queue and
attempt in ROWCLAIM_ID, ROWCLAIM_KIND, ROWCLAIM_QUEUE and ROWCLAIM_ATTEMPT. What it prints on
stdout (here a JSON document) is kept as the job's output (`rowclaim jobs show ID`). Exit 0
completes the job; any other exit fails it (retried with backoff until its last attempt); 75
asks to run it again later without using an attempt.
"""

import json
import os
import sys


def main() -> int:
    payload = json.load(sys.stdin)
    to = payload.get("to")
    if not to:
        print("no recipient in the payload", file=sys.stderr)
        return 1
    # ... send the mail here ...
    json.dump(
        {"sent_to": to, "job": int(os.environ["ROWCLAIM_ID"]),
         "attempt": int(os.environ["ROWCLAIM_ATTEMPT"])},
        sys.stdout,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
