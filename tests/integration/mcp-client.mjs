// `vmctl mcp` driven by the official MCP TypeScript SDK (@modelcontextprotocol/sdk, pinned in
// mcp/package-lock.json; mcp/install.sh installs it), on an agent that exists already. TAP on
// stdout; exits 1 when a check fails.
//
//   VMCTL          the vmctl to run (default: vmctl on PATH)
//   HOSTD_SOCKET   hostd's socket, passed as --socket (default: vmctl's own default;
//                  $VMCTL_HOST passes through, so a remote hostd works too)
//   MCP_AGENT      the agent the tools run on (required); its user's home is written to
//   MCP_NEW_AGENT  when set, new_agent creates an agent of this name first (the caller removes it)
//   MCP_FORK_NAME  when set, fork makes an agent of this name (the caller removes it)
//   MCP_EXPECT_PROGRESS=1  fail when no progress notification comes during new_agent/checkpoint
//
// The unit suite runs it against a fake hostd (tests/unit/test-vmctl-mcp.c); the VM suite's
// runner is mcp-check.sh.
import { Client, StdioClientTransport, McpError } from './mcp/sdk.mjs';

const vmctl = process.env.VMCTL || 'vmctl';
const socketArgs = process.env.HOSTD_SOCKET ? ['--socket', process.env.HOSTD_SOCKET] : [];
const agent = process.env.MCP_AGENT;
const expectProgress = process.env.MCP_EXPECT_PROGRESS === '1';
const LONG = { timeout: 900_000, resetTimeoutOnProgress: true };

let n = 0;
let failed = 0;
function ok(condition, description, detail) {
    n++;
    if (condition) {
        console.log(`ok ${n} - ${description}`);
    } else {
        failed++;
        console.log(`not ok ${n} - ${description}`);
        if (detail !== undefined)
            for (const line of JSON.stringify(detail, null, 2).split('\n'))
                console.log(`# ${line}`);
    }
    return condition;
}
function diag(text) {
    console.log(`# ${text}`);
}

async function connect(extra = []) {
    const client = new Client({ name: 'vmctl-mcp-check', version: '1.0.0' });
    const transport = new StdioClientTransport({
        command: vmctl,
        args: ['mcp', ...socketArgs, ...extra],
        stderr: 'inherit',
    });
    await client.connect(transport);
    return client;
}

// Calls a tool and returns its structured result; a tool error fails the check and returns null.
async function call(client, name, args, options = {}) {
    const result = await client.callTool({ name, arguments: args }, undefined, options);
    if (result.isError) {
        ok(false, `${name} succeeds`, result.content);
        return null;
    }
    return result.structuredContent;
}

// The error object a tool error carries as its text, or null when the call succeeded.
async function toolError(client, name, args) {
    const result = await client.callTool({ name, arguments: args });
    if (!result.isError)
        return null;
    try {
        return JSON.parse(result.content[0].text).error;
    } catch {
        return { code: '(not JSON)', message: result.content[0]?.text };
    }
}

const allTools = [
    'list_agents', 'agent_info', 'new_agent', 'exec', 'read_file', 'write_file', 'checkpoint',
    'list_checkpoints', 'restore', 'diff', 'fork', 'suspend', 'resume', 'set_resources',
    'egress_show',
];
const readOnlyTools = [
    'list_agents', 'agent_info', 'read_file', 'list_checkpoints', 'diff', 'egress_show',
];

async function main() {
    if (!agent) {
        console.log('1..0 # SKIP MCP_AGENT is not set');
        return;
    }
    const client = await connect();
    ok(client.getServerVersion()?.name === 'vmctl', 'initialize: the server is vmctl',
        client.getServerVersion());
    ok(client.getServerCapabilities()?.tools !== undefined, 'initialize: it offers tools');

    const { tools } = await client.listTools();
    const names = tools.map(t => t.name).sort();
    ok(JSON.stringify(names) === JSON.stringify([...allTools].sort()), 'tools/list: every tool',
        names);
    ok(tools.every(t => t.inputSchema?.type === 'object' && t.outputSchema?.type === 'object'),
        'tools/list: each tool has an input and an output schema');

    if (process.env.MCP_NEW_AGENT) {
        let progress = 0;
        const created = await call(client, 'new_agent', { name: process.env.MCP_NEW_AGENT },
            { ...LONG, onprogress: () => progress++ });
        ok(created?.agent?.name === process.env.MCP_NEW_AGENT, 'new_agent creates the agent',
            created);
        ok(progress > 0 || !expectProgress, `new_agent reports progress (${progress})`);
    }

    const listed = await call(client, 'list_agents', {});
    ok(listed?.agents?.some(a => a.name === agent), `list_agents lists ${agent}`, listed);
    const info = await call(client, 'agent_info', { name: agent });
    ok(info?.agent?.name === agent && typeof info.agent.state === 'string', 'agent_info', info);

    // exec: status, both streams, stdin, environment, directory, bounded output
    let r = await call(client, 'exec',
        { name: agent, command: ['sh', '-c', 'echo out; echo err >&2; exit 3'] });
    ok(r?.exit_status === 3 && r.stdout === 'out\n' && r.stderr === 'err\n',
        'exec: exit status, stdout and stderr apart', r);
    r = await call(client, 'exec', { name: agent, command: ['cat'], stdin: 'hello\nworld\n' });
    ok(r?.stdout === 'hello\nworld\n' && r.exit_status === 0, 'exec: stdin reaches the command', r);
    r = await call(client, 'exec', {
        name: agent, command: ['sh', '-c', 'printf "%s:%s" "$GREETING" "$(pwd)"'],
        env: { GREETING: 'hi' }, workdir: '/',
    });
    ok(r?.stdout === 'hi:/', 'exec: env and workdir', r);
    r = await call(client, 'exec', {
        name: agent, command: ['sh', '-c', 'yes | head -c 100000'], max_output_bytes: 1000,
    });
    ok(r?.stdout.length === 1000 && r.stdout_bytes === 100000 && r.stdout_truncated === true,
        'exec: output past max_output_bytes is counted, cut and said so',
        r && { ...r, stdout: `${r.stdout.length} characters` });

    // files: write then read, text and bytes
    r = await call(client, 'exec', { name: agent, command: ['pwd'] });
    const home = r?.stdout.trim() || '/tmp';
    const file = `${home}/mcp-check.txt`;
    const bin = `${home}/mcp-check.bin`;
    r = await call(client, 'write_file', { name: agent, path: file, content: 'before\n' });
    ok(r?.bytes === 7, 'write_file writes the text', r);
    r = await call(client, 'read_file', { name: agent, path: file });
    ok(r?.content === 'before\n' && r.encoding === 'text' && r.truncated === false,
        'read_file reads it back', r);
    const bytes = Buffer.from(Array.from({ length: 256 }, (_, i) => i));
    r = await call(client, 'write_file',
        { name: agent, path: bin, content: bytes.toString('base64'), encoding: 'base64' });
    ok(r?.bytes === 256, 'write_file writes bytes given in base64', r);
    r = await call(client, 'read_file', { name: agent, path: bin, encoding: 'base64' });
    ok(r?.encoding === 'base64' && Buffer.from(r.content, 'base64').equals(bytes),
        'read_file reads every byte back', r);
    r = await call(client, 'read_file', { name: agent, path: bin });
    ok(r?.encoding === 'base64', 'read_file falls back to base64 for bytes that are not text', r);

    // checkpoint, break, diff, restore
    let progress = 0;
    const taken = await call(client, 'checkpoint', { name: agent, label: 'mcp-check' },
        { ...LONG, onprogress: () => progress++ });
    const id = taken?.checkpoint?.id;
    ok(typeof id === 'string' && taken.checkpoint.label === 'mcp-check', 'checkpoint', taken);
    r = await call(client, 'list_checkpoints', { name: agent });
    ok(r?.checkpoints?.some(c => c.id === id), 'list_checkpoints lists it', r);
    await call(client, 'write_file', { name: agent, path: file, content: 'after\n' });
    await call(client, 'exec', { name: agent, command: ['sync'] });
    r = await call(client, 'diff', { name: agent, checkpoint: id, path: home },
        { ...LONG, onprogress: () => progress++ });
    ok(r?.changes?.some(c => c.kind === 'M' && c.path === file) && r.truncated === false,
        'diff shows the file modified since the checkpoint', r);
    r = await call(client, 'restore', { name: agent, checkpoint: id, paths: [file] },
        { ...LONG, onprogress: () => progress++ });
    ok(typeof r?.undo === 'string' && r.agent?.name === agent, 'restore of a path', r);
    r = await call(client, 'read_file', { name: agent, path: file });
    ok(r?.content === 'before\n', 'the file is as it was at the checkpoint', r);
    ok(progress > 0 || !expectProgress, `long calls report progress (${progress})`);

    if (process.env.MCP_FORK_NAME) {
        r = await call(client, 'fork',
            { source: agent, name: process.env.MCP_FORK_NAME, checkpoint: id }, LONG);
        ok(r?.agent?.name === process.env.MCP_FORK_NAME && r.checkpoint === id,
            'fork from the checkpoint', r);
    }

    r = await call(client, 'suspend', { name: agent });
    ok(r?.agent?.state === 'paused', 'suspend pauses', r);
    r = await call(client, 'resume', { name: agent });
    ok(r?.agent?.state === 'running', 'resume wakes it', r);
    r = await call(client, 'egress_show', { name: agent });
    ok(Array.isArray(r?.egress?.allow), 'egress_show', r);

    // failures: tool errors with vmctl's code names, protocol errors for what is no tool
    let e = await toolError(client, 'exec', { name: agent, command: 'ls' });
    ok(e?.code === 'invalid-argument', 'a bad argument is a tool error (invalid-argument)', e);
    e = await toolError(client, 'agent_info', { name: 'no-such-agent-mcp' });
    ok(e?.code === 'not-found' && /no-such-agent-mcp/.test(e.message),
        'an unknown agent is a tool error (not-found)', e);
    e = await toolError(client, 'exec', { name: agent, command: ['sleep', '30'], timeout_s: 1 });
    ok(e?.code === 'timeout', 'a command past timeout_s is a tool error (timeout)', e);
    try {
        await client.callTool({ name: 'no_such_tool', arguments: {} });
        ok(false, 'an unknown tool is a protocol error');
    } catch (err) {
        ok(err instanceof McpError && err.code === -32602, 'an unknown tool is a protocol error',
            String(err));
    }

    // 20 exec calls at once in one session: each gets its own output and status
    const many = await Promise.all(Array.from({ length: 20 }, (_, i) =>
        client.callTool({ name: 'exec', arguments: {
            name: agent, command: ['sh', '-c', `echo call-${i}; exit ${i % 5}`] } })));
    const wrong = many.map((m, i) => ({ i, m })).filter(({ i, m }) =>
        m.isError || m.structuredContent?.stdout !== `call-${i}\n` ||
        m.structuredContent?.exit_status !== i % 5);
    ok(wrong.length === 0, '20 concurrent exec calls: each its own stdout and status',
        wrong.slice(0, 3));

    // cancellation: the call ends at once, the server goes on
    const controller = new AbortController();
    const started = Date.now();
    setTimeout(() => controller.abort('enough'), 1000);
    try {
        await client.callTool({ name: 'exec', arguments: { name: agent, command: ['sleep', '60'] } },
            undefined, { signal: controller.signal });
        ok(false, 'a cancelled exec ends');
    } catch (err) {
        const seconds = (Date.now() - started) / 1000;
        ok(seconds < 10, `a cancelled exec of sleep 60 ends (${seconds.toFixed(1)} s)`, String(err));
    }
    await client.ping();
    r = await call(client, 'exec', { name: agent, command: ['true'] });
    ok(r?.exit_status === 0, 'the server goes on after the cancel', r);
    await client.close();

    // --read-only offers the tools that change nothing, and only those
    const reader = await connect(['--read-only']);
    const readNames = (await reader.listTools()).tools.map(t => t.name).sort();
    ok(JSON.stringify(readNames) === JSON.stringify([...readOnlyTools].sort()),
        '--read-only lists only the read-only tools', readNames);
    try {
        await reader.callTool({ name: 'exec', arguments: { name: agent, command: ['true'] } });
        ok(false, '--read-only refuses exec');
    } catch (err) {
        ok(err instanceof McpError && err.code === -32602, '--read-only refuses exec', String(err));
    }
    await reader.close();

    // --agent serves only the agents named
    const other = await connect(['--agent', 'zz-not-this-one']);
    r = await call(other, 'list_agents', {});
    ok(r?.agents && !r.agents.some(a => a.name === agent), '--agent hides the other agents', r);
    e = await toolError(other, 'agent_info', { name: agent });
    ok(e?.code === 'not-found', '--agent refuses the other agents', e);
    await other.close();
}

const timer = setTimeout(() => {
    console.log('not ok - the check did not end within 15 minutes');
    process.exit(1);
}, 900_000);
timer.unref();
try {
    await main();
} catch (err) {
    ok(false, 'no exception', String(err?.stack || err));
}
if (n > 0)
    console.log(`1..${n}`);
process.exit(failed > 0 ? 1 : 0);
