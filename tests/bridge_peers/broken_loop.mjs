// conforming_loop.mjs with a defect common in real loops: it runs a tool call
// without checking its arguments against the tool's JSON Schema, so a call the model
// got wrong is executed instead of answered with an error result (I3).
import { hooks, main } from "./conforming_loop.mjs";

hooks.validate = false;
await main("tests/bridge_peers/broken_loop.mjs");
