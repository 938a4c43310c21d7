package testkit

import "net/http"

// HTTP1Client is a client that speaks HTTP/1.1 only, over connections of
// its own that it keeps alive.
func HTTP1Client() *http.Client {
	var p http.Protocols
	p.SetHTTP1(true)
	return &http.Client{Transport: &http.Transport{Protocols: &p}}
}
