package runner

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/codemode-go/codemode/agent/internal/wire"
	runnerv1 "github.com/codemode-go/codemode/gen/codemode/runner/v1"
	"github.com/codemode-go/codemode/internal/testkit"
	"github.com/codemode-go/codemode/internal/testkit/benchbase"
)

// nearLimitCode is a fixed loop in each language that first takes the
// sandbox's memory usage to at least target bytes (if it is below), then
// prints the loop's own time in microseconds and the usage after it.
var nearLimitCode = map[string]string{
	"javascript": `const fs = require('fs');
const usage = () => Number(fs.readFileSync('/sys/fs/cgroup/memory/memory.usage_in_bytes', 'utf8'));
const fill = Math.max(0, TARGET - usage());
const held = fill > 0 ? Buffer.alloc(fill, 1) : null;
const t = process.hrtime.bigint();
let s = 0;
for (let i = 0; i < 1e8; i++) s += i;
console.log(Number((process.hrtime.bigint() - t) / 1000n), usage(), held ? held.length : 0, s > 0);`,
	"python": `import time
def usage():
    return int(open('/sys/fs/cgroup/memory/memory.usage_in_bytes').read())
fill = max(0, TARGET - usage())
held = bytearray(b'\x01') * fill if fill else None
t = time.perf_counter()
s = 0
for i in range(3_000_000):
    s += i
print(int((time.perf_counter() - t) * 1e6), usage(), len(held or b''), s > 0)`,
}

// BenchmarkSandboxNearMemoryLimit measures what the memory watchdog costs a
// run whose sandbox is near its limit, where it looks at the usage every
// millisecond (memoryPollNear): the same loop in a 512 MiB sandbox with
// the preloaded parents, once with the sandbox's usage as the run leaves
// it and once after the run took it 24 MiB into the watchdog's fast band,
// in turns. The ratio near/far is what the fast looks cost the loop:
//
//	go test -run '^$' -bench SandboxNearMemoryLimit -benchtime 15x ./agent/internal/runner
func BenchmarkSandboxNearMemoryLimit(b *testing.B) {
	const limit = 512 << 20
	sb := startSandboxOpts(b, buildRunner(b), "512m", "-preload=default")
	threshold := uint64(limit - memoryHeadroom(limit))
	band := threshold - memoryNearThreshold
	ctx := b.Context()
	for _, lang := range []string{"javascript", "python"} {
		b.Run(lang, func(b *testing.B) {
			cpu := sb.cpuUsage(b)
			run := func(target uint64) (loop time.Duration, usage uint64, cpuTime time.Duration) {
				code := strings.Replace(nearLimitCode[lang], "TARGET", strconv.FormatUint(target, 10), 1)
				var out strings.Builder
				c0 := cpu()
				exit, err := sb.c.Run(ctx, &runnerv1.Run{Language: lang, Code: code, Timeout: durationpb.New(60 * time.Second)}, func(_ wire.Stream, p []byte) { out.Write(p) })
				c1 := cpu()
				if err != nil || exit.GetCode() != 0 {
					b.Fatalf("run: %v %v %q", exit, err, out.String())
				}
				if err := sb.c.Reset(ctx); err != nil {
					b.Fatal(err)
				}
				var us int64
				if _, err := fmt.Sscan(out.String(), &us, &usage); err != nil {
					b.Fatalf("output %q: %v", out.String(), err)
				}
				return time.Duration(us) * time.Microsecond, usage, c1 - c0
			}
			run(0) // the prestart in the language
			var far, near []time.Duration
			var farCPU, nearCPU time.Duration
			for b.Loop() {
				l, u, c := run(0)
				if u >= band {
					b.Fatalf("a run as it is used %d MiB, in the fast band from %d MiB", u>>20, band>>20)
				}
				far, farCPU = append(far, l), farCPU+c
				l, u, c = run(band + 24<<20)
				if u < band || u >= threshold {
					b.Fatalf("a run near the limit used %d MiB, want %d-%d MiB", u>>20, band>>20, threshold>>20)
				}
				near, nearCPU = append(near, l), nearCPU+c
			}
			n := float64(len(far))
			ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / n }
			b.ReportMetric(ms(farCPU), "far-cpu-ms")
			b.ReportMetric(ms(nearCPU), "near-cpu-ms")
			farP50, nearP50 := benchbase.Percentile(far, 50), benchbase.Percentile(near, 50)
			b.ReportMetric(float64(farP50.Microseconds())/1000, "far-p50-ms")
			b.ReportMetric(float64(nearP50)/float64(farP50), "near/far-p50")
			testkit.ReportPercentiles(b, near, time.Millisecond)
		})
	}
}
