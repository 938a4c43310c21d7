package deploy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/common/util"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/engine"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/yaml"
)

// chartValues are the value sets the chart is rendered with.
var chartValues = map[string]map[string]any{
	"defaults": {
		"cluster": map[string]any{"secret": strings.Repeat("s", 44)},
		"edge":    map[string]any{"apiKeys": map[string]any{"existingSecret": "codemode-api-keys"}},
	},
	"tls everywhere, external redis": {
		"cluster": map[string]any{"existingSecret": "cluster", "tls": map[string]any{"enabled": true, "caSecret": "cluster-ca", "controlplaneSecret": "cp-tls"}},
		"edge": map[string]any{"apiKeys": map[string]any{"existingSecret": "keys"}, "tls": map[string]any{"secretName": "edge-tls"},
			"autoscaling": map[string]any{"enabled": false}, "podDisruptionBudget": map[string]any{"enabled": false}},
		"redis":        map[string]any{"existingSecret": "redis-url", "statefulset": map[string]any{"enabled": false}},
		"controlplane": map[string]any{"agentService": map[string]any{"type": "LoadBalancer"}, "agents": "sbx1.internal:30031"},
	},
	"acme, agents as a daemonset": {
		"cluster": map[string]any{"secret": strings.Repeat("x", 40), "insecureInternal": true},
		"edge": map[string]any{"apiKeys": map[string]any{"existingSecret": "keys"},
			"acme": map[string]any{"hosts": []any{"codemode.example.org"}, "email": "ops@example.org"}, "networkPolicy": map[string]any{"enabled": false}},
		"agent": map[string]any{"daemonset": map[string]any{"enabled": true, "image": "registry.internal/codemode-agent:v1"}},
	},
}

// The chart renders with every value set into objects that decode strictly
// (an unknown field fails) into the Kubernetes API's types, and every flag
// and variable it gives a container is one the binary it runs knows.
func TestHelmChart(t *testing.T) {
	chrt, err := loader.Load("helm/codemode")
	if err != nil {
		t.Fatal(err)
	}
	for name, vals := range chartValues {
		t.Run(name, func(t *testing.T) {
			rv, err := util.ToRenderValues(chrt, vals, common.ReleaseOptions{Name: "cm", Namespace: "codemode", IsInstall: true}, common.DefaultCapabilities)
			if err != nil {
				t.Fatal(err)
			}
			out, err := engine.Render(chrt, rv)
			if err != nil {
				t.Fatalf("render: %v", err)
			}
			kinds := map[string]int{}
			for file, text := range out {
				for _, doc := range strings.Split(text, "\n---") {
					if strings.TrimSpace(stripComments(doc)) == "" {
						continue
					}
					kind := decodeStrict(t, file, doc)
					kinds[kind]++
				}
			}
			for _, want := range []string{"Deployment", "Service"} {
				if kinds[want] == 0 {
					t.Errorf("no %s rendered: %v", want, kinds)
				}
			}
			t.Logf("rendered %v", kinds)
		})
	}
}

// Values that cannot work are refused when rendering, saying why.
func TestHelmChartRefuses(t *testing.T) {
	chrt, err := loader.Load("helm/codemode")
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string]any{"existingSecret": "keys"}
	for _, tc := range []struct {
		vals map[string]any
		want string
	}{
		{map[string]any{"cluster": map[string]any{"secret": "short"}, "edge": map[string]any{"apiKeys": keys}}, "at least 32 bytes"},
		{map[string]any{"cluster": map[string]any{"secret": strings.Repeat("s", 40)}}, "edge.apiKeys.existingSecret"},
		{map[string]any{"cluster": map[string]any{"secret": strings.Repeat("s", 40)}, "edge": map[string]any{"apiKeys": keys,
			"tls": map[string]any{"secretName": "t"}, "acme": map[string]any{"hosts": []any{"a.example.org"}}}}, "one or the other"},
		{map[string]any{"cluster": map[string]any{"secret": strings.Repeat("s", 40), "tls": map[string]any{"enabled": true}}, "edge": map[string]any{"apiKeys": keys}}, "cluster.tls.caSecret"},
	} {
		rv, err := util.ToRenderValues(chrt, tc.vals, common.ReleaseOptions{Name: "cm", Namespace: "codemode", IsInstall: true}, common.DefaultCapabilities)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := engine.Render(chrt, rv); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("values %v: %v, want an error saying %q", tc.vals, err, tc.want)
		}
	}
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// decodeStrict decodes one rendered object into its API type, failing on
// any field the type does not have, checks its containers against the
// binaries, and returns its kind.
func decodeStrict(t *testing.T, file, doc string) string {
	t.Helper()
	js, err := yaml.YAMLToJSON([]byte(doc))
	if err != nil {
		t.Fatalf("%s: not YAML: %v\n%s", file, err, doc)
	}
	var meta struct{ APIVersion, Kind string }
	if err := json.Unmarshal(js, &meta); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	var obj any
	var pod *corev1.PodSpec
	switch meta.APIVersion + " " + meta.Kind {
	case "apps/v1 Deployment":
		d := &appsv1.Deployment{}
		obj, pod = d, &d.Spec.Template.Spec
	case "apps/v1 StatefulSet":
		s := &appsv1.StatefulSet{}
		obj, pod = s, &s.Spec.Template.Spec
	case "apps/v1 DaemonSet":
		d := &appsv1.DaemonSet{}
		obj, pod = d, &d.Spec.Template.Spec
	case "v1 Service":
		obj = &corev1.Service{}
	case "v1 Secret":
		obj = &corev1.Secret{}
	case "autoscaling/v2 HorizontalPodAutoscaler":
		obj = &autoscalingv2.HorizontalPodAutoscaler{}
	case "policy/v1 PodDisruptionBudget":
		obj = &policyv1.PodDisruptionBudget{}
	case "networking.k8s.io/v1 NetworkPolicy":
		obj = &networkingv1.NetworkPolicy{}
	default:
		t.Fatalf("%s: unexpected %s %s", file, meta.APIVersion, meta.Kind)
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(obj); err != nil {
		t.Fatalf("%s: %s does not decode strictly: %v\n%s", file, meta.Kind, err, doc)
	}
	if pod != nil {
		for _, c := range pod.Containers {
			checkContainer(t, file, c)
		}
	}
	return meta.Kind
}

// checkContainer checks that each --flag and each variable the chart gives a
// codemode container is one its binary's --help names.
func checkContainer(t *testing.T, file string, c corev1.Container) {
	t.Helper()
	if c.Name == "redis" {
		return
	}
	help := binaryHelp(t, c.Name)
	flagName := regexp.MustCompile(`^--?([a-z0-9-]+)`)
	for _, a := range append(slices.Clone(c.Args), c.Command...) {
		m := flagName.FindStringSubmatch(a)
		if m == nil {
			continue
		}
		if !strings.Contains(help, "\n  -"+m[1]+" ") && !strings.Contains(help, "\n  -"+m[1]+"\n") {
			t.Errorf("%s: container %s passes --%s, which `%s --help` does not list", file, c.Name, m[1], c.Name)
		}
	}
	for _, e := range c.Env {
		if e.Name == "NODE_IP" { // the chart's own, used in another variable
			continue
		}
		if !strings.Contains(help, e.Name) {
			t.Errorf("%s: container %s gets %s, which `%s --help` does not name", file, c.Name, e.Name, c.Name)
		}
	}
}

var (
	helpMu  sync.Mutex
	helpDir string
	helps   = map[string]string{}
)

// binaryHelp is the --help output of the binary name (edge, controlplane,
// agent), built once.
func binaryHelp(t *testing.T, name string) string {
	t.Helper()
	helpMu.Lock()
	defer helpMu.Unlock()
	if h, ok := helps[name]; ok {
		return h
	}
	if helpDir == "" {
		dir, err := os.MkdirTemp("", "codemode-chart-bins-")
		if err != nil {
			t.Fatal(err)
		}
		build := exec.Command("go", "build", "-o", dir+"/", "./edge/cmd/edge", "./controlplane/cmd/controlplane", "./agent/cmd/agent")
		build.Dir = ".."
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("build: %v\n%s", err, out)
		}
		helpDir = dir
	}
	out, _ := exec.Command(filepath.Join(helpDir, name), "--help").CombinedOutput()
	if !strings.Contains(string(out), "Usage") {
		t.Fatalf("%s --help: %s", name, out)
	}
	helps[name] = string(out)
	return helps[name]
}

func TestMain(m *testing.M) {
	code := m.Run()
	if helpDir != "" {
		os.RemoveAll(helpDir)
	}
	os.Exit(code)
}

var _ = fmt.Sprint
