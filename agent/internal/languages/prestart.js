// A Node.js interpreter started ahead of one stateless run of codemode's
// runner, so that the run does not wait for node to start. It runs as
// `node -e` with this source, as the sandbox's user, and serves exactly one
// run; the runner's scrub kills it if no run takes it.
//
// It writes one byte to fd 4 and closes it once it is ready. The runner then
// writes one byte (whether the run has standard input; without it fd 0 is a
// pipe that is already at its end) and the run's UTF-8 source to fd 3 and
// closes it. The source runs as `node -e` runs its argument: in this
// context, as "[eval]", with require, module and the rest as globals.
require("vm").runInThisContext((() => {
  const fs = require("fs");
  fs.writeSync(4, "r");
  fs.closeSync(4);
  const chunks = [];
  const buf = Buffer.alloc(1 << 20);
  for (;;) {
    const n = fs.readSync(3, buf, 0, buf.length, null);
    if (n === 0) {
      break;
    }
    chunks.push(Buffer.from(buf.subarray(0, n)));
  }
  fs.closeSync(3);
  return Buffer.concat(chunks).subarray(1).toString("utf8");
})(), { filename: "[eval]" });
