package execution

import (
	"context"

	"connectrpc.com/connect"

	cpv1 "github.com/codemode-go/codemode/gen/codemode/controlplane/v1"
)

// Agents returns the agents the control plane routes to, with their health
// and last reported status, for c.
//
// # Notes
//
// Each agent carries its address, which is internal: a door that answers
// the public must not pass it on (name agents by Status.Name instead).
func (s *Service) Agents(ctx context.Context, c Caller) (_ []*cpv1.Agent, err error) {
	c = c.withID()
	defer s.publicError(c, "", &err)
	res, err := s.cp.ListAgents(ctx, connect.NewRequest(&cpv1.ListAgentsRequest{}))
	if err != nil {
		return nil, err
	}
	return res.Msg.GetAgents(), nil
}
