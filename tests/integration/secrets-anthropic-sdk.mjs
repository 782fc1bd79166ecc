// The Anthropic TypeScript SDK with its defaults, for tests/integration/vm-secrets.sh: the key
// from ANTHROPIC_API_KEY, the base URL its own (https://api.anthropic.com). Prints
// "answer: TEXT" with the answer's text, or "error: ..." and exits 1.
import Anthropic from '@anthropic-ai/sdk';

const client = new Anthropic();
try {
    const message = await client.messages.create({
        model: 'claude-x',
        max_tokens: 8,
        messages: [{ role: 'user', content: 'hi' }],
    });
    console.log('answer:', message.content[0].text);
} catch (e) {
    console.log('error:', e.message, e.cause?.code ?? e.cause?.message ?? '');
    process.exitCode = 1;
}
