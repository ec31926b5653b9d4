// A rowclaim job handler in Node.js: `rowclaim work --queue mail -- node handler.mjs`.
// The job's payload arrives as JSON on stdin (its id, kind, queue and attempt in ROWCLAIM_ID,
// ROWCLAIM_KIND, ROWCLAIM_QUEUE, ROWCLAIM_ATTEMPT); what it prints is kept as the job's output.
// Exit 0 completes the job; any other exit fails it (retried with backoff).
let input = "";
for await (const chunk of process.stdin) input += chunk;
const payload = JSON.parse(input);
if (!payload.to) {
  console.error("no recipient in the payload");
  process.exit(1);
}
// ... send the mail here ...
process.stdout.write(
  JSON.stringify({
    sent_to: payload.to,
    job: Number(process.env.ROWCLAIM_ID),
    attempt: Number(process.env.ROWCLAIM_ATTEMPT),
  }),
);
