// What ../mcp-client.mjs takes from the SDK, resolved from this directory's node_modules.
export { Client } from '@modelcontextprotocol/sdk/client/index.js';
export { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
export { McpError } from '@modelcontextprotocol/sdk/types.js';
