package e2e

import (
	"os"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	edgev1 "github.com/codemode-go/codemode/gen/codemode/edge/v1"
	"github.com/codemode-go/codemode/gen/codemode/edge/v1/edgev1connect"
	"github.com/codemode-go/codemode/internal/server"
	"github.com/codemode-go/codemode/internal/testkit/dockertest"
)

// TestImageContract runs, through the edge, what docs/sandbox.md promises the
// sandbox image has: the original's `python - <<'PY'` payloads, the data
// libraries, matplotlib drawing without a display, and the command-line
// tools.
func TestImageContract(t *testing.T) {
	t.Parallel()
	s := shared(t)
	c := edgev1connect.NewExecutionServiceClient(httpClient, s.Edge.URL())
	cases := []struct {
		name, language, code, want string
	}{
		{"python heredoc through bash", "bash", "python - <<'PY'\nprint(1)\nPY", "1\n"},
		{"python is python3", "bash", "python --version; python3 --version", "Python 3.11"},
		{"data libraries", "python", "import requests, numpy, pandas, scipy, matplotlib\nprint(numpy.array([1, 2]).sum() + len(pandas.DataFrame({'a': [1]})))", "4\n"},
		{"matplotlib draws a PNG", "python", "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.savefig('/workspace/chart.png')\nprint(open('/workspace/chart.png', 'rb').read(8) == b'\\x89PNG\\r\\n\\x1a\\n')", "True\n"},
		// mpl_toolkits is a namespace package without Debian's pkg_resources
		// shim, whose import cost each plotting run ~300 ms (agent/host/setup.sh).
		{"3D axes, without pkg_resources", "python", "import sys\nimport matplotlib.pyplot as plt\nfrom mpl_toolkits.mplot3d import Axes3D\nax = plt.figure().add_subplot(projection='3d')\nprint(isinstance(ax, Axes3D), 'pkg_resources' in sys.modules)", "True False\n"},
		{"command-line tools", "bash", "curl --version | head -1 | cut -d' ' -f1; git --version | cut -d' ' -f1; echo '{\"a\": 2}' | jq .a; pip --version | cut -d' ' -f1", "curl\ngit\n2\npip\n"},
		{"a C compiler", "bash", "printf 'int main(){return 42;}' > m.c && gcc m.c -o m && ./m; echo $?", "42\n"},
	}
	// One at a time: the imports keep a sandbox busy for seconds, and the
	// shared stack serves other tests meanwhile.
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res, err := c.Execute(t.Context(), connect.NewRequest(&edgev1.ExecuteRequest{Language: tc.language, Code: tc.code, Timeout: durationpb.New(2 * time.Minute)}))
			if err != nil {
				t.Fatal(err)
			}
			r := res.Msg.GetResult()
			if r.GetExitCode() != 0 || !strings.Contains(r.GetStdout(), tc.want) {
				t.Errorf("exit %d, stdout %q, stderr %q; want stdout with %q", r.GetExitCode(), r.GetStdout(), r.GetStderr(), tc.want)
			}
		})
	}
}

// BenchmarkImageAgainstBaseline times a stateless print(1) through two
// stacks, one on the sandbox image set-up builds and one on the image named
// by CODEMODE_BASELINE_IMAGE (for example the previous build, kept with
// docker tag), in turns, and reports both p50s and their ratio.
func BenchmarkImageAgainstBaseline(b *testing.B) {
	dockertest.Need(b)
	baseline := os.Getenv("CODEMODE_BASELINE_IMAGE")
	if baseline == "" {
		b.Skip("set CODEMODE_BASELINE_IMAGE to a local image to compare the sandbox image with")
	}
	stacks := make([]*Stack, 2)
	for i, args := range [][]string{{"--min-active", "3"}, {"--min-active", "3", "--image", baseline}} {
		s, err := StartStack([]string{"e2e-bench-image", "e2e-bench-baseline"}[i], args...)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(s.Stop)
		stacks[i] = s
	}
	run := func(s *Stack) func() {
		c := edgev1connect.NewExecutionServiceClient(server.NewClient(), s.Edge.URL())
		return func() {
			res, err := c.Execute(b.Context(), connect.NewRequest(&edgev1.ExecuteRequest{Code: "print(1)"}))
			if err != nil || res.Msg.GetResult().GetStdout() != "1\n" {
				b.Fatalf("run: %v %v", res, err)
			}
		}
	}
	pairedLatency(b, pair{"image", run(stacks[0])}, pair{"baseline", run(stacks[1])})
}
