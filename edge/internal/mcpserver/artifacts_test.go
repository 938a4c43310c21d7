package mcpserver

import (
	"encoding/json"
	"testing"

	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
)

func TestArtifactContent(t *testing.T) {
	t.Parallel()
	png := []byte("\x89PNG\r\n\x1a\n")
	content := ArtifactContent("req-1", []*executionv1.Artifact{
		{Name: "figure-1.png", MediaType: "image/png", Content: png},
		{Name: "data/a b.csv", MediaType: "text/csv; charset=utf-8", Content: []byte("x,y\n")},
		{Name: "r.json", MediaType: "application/json", Content: []byte("{}")},
		{Name: "blob.bin", MediaType: "application/octet-stream", Content: []byte{0, 1, 2}},
		{Name: "bad.txt", MediaType: "text/plain", Content: []byte{0xff, 0xfe}},
	})
	want := []string{
		`{"type":"image","mimeType":"image/png","data":"iVBORw0KGgo="}`,
		`{"type":"resource","resource":{"uri":"codemode://runs/req-1/artifacts/data/a%20b.csv","mimeType":"text/csv; charset=utf-8","text":"x,y\n"}}`,
		`{"type":"resource","resource":{"uri":"codemode://runs/req-1/artifacts/r.json","mimeType":"application/json","text":"{}"}}`,
		`{"type":"resource","resource":{"uri":"codemode://runs/req-1/artifacts/blob.bin","mimeType":"application/octet-stream","blob":"AAEC"}}`,
		`{"type":"resource","resource":{"uri":"codemode://runs/req-1/artifacts/bad.txt","mimeType":"text/plain","blob":"//4="}}`,
	}
	if len(content) != len(want) {
		t.Fatalf("%d content items, want %d", len(content), len(want))
	}
	for i, c := range content {
		b, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		var got, w any
		json.Unmarshal(b, &got)
		json.Unmarshal([]byte(want[i]), &w)
		gb, _ := json.Marshal(got)
		wb, _ := json.Marshal(w)
		if string(gb) != string(wb) {
			t.Errorf("item %d = %s, want %s", i, gb, wb)
		}
	}
}
