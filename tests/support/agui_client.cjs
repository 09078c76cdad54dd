// Drives @ag-ui/client's HttpAgent through several runs of one thread and prints what it saw, as JSON.
// Usage: node agui_client.cjs '{"url", "threadId", "runs": [{"message", "history"?, "resume"?}], "headers", "modules"}'
const { createRequire } = require('node:module');

const config = JSON.parse(process.argv[2]);
const { HttpAgent } = createRequire(`${config.modules}/`)('@ag-ui/client');

async function main() {
  const agent = new HttpAgent({ url: config.url, threadId: config.threadId, headers: config.headers });
  const seen = [];
  let count = 0;
  let interrupts = [];
  for (const run of config.runs) {
    if (run.history) agent.setMessages(run.history);
    if (run.message !== undefined) {
      count += 1;
      agent.addMessage({ id: `user-${count}`, role: 'user', content: run.message });
    }
    const types = [];
    const tools = [];
    let finished = null;
    let error = null;
    let result = null;
    try {
      // resumeAll answers every interrupt the previous run ended with, with the same payload.
      const resume = run.resumeAll
        ? interrupts.map((item) => ({ interruptId: item.id, status: 'resolved', payload: run.resumeAll }))
        : run.resume;
      const answer = await agent.runAgent(resume ? { resume } : {}, {
        onEvent({ event }) {
          types.push(event.type);
          if (event.type.startsWith('TOOL_CALL_')) tools.push(event);
          if (event.type === 'RUN_FINISHED') finished = event;
          if (event.type === 'RUN_ERROR') error = { message: event.message, code: event.code };
        },
      });
      result = answer.result ?? null;
    } catch (failure) {
      error = error || { message: String(failure && failure.message) };
    }
    interrupts = finished && finished.outcome ? finished.outcome.interrupts || [] : [];
    seen.push({
      types, tools, result, error,
      outcome: finished && finished.outcome ? finished.outcome.type : null,
      interrupts: finished && finished.outcome ? finished.outcome.interrupts || [] : [],
      messages: agent.messages.map((m) => ({ id: m.id, role: m.role, content: m.content })),
      state: agent.state,
    });
  }
  process.stdout.write(JSON.stringify(seen));
}

main().catch((failure) => {
  process.stderr.write(String(failure && failure.stack));
  process.exit(1);
});
