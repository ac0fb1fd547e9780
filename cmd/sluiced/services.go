package main

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/sluice-net/sluice/cmd/internal/agent"
)

// readyCollector is sluice_services_ready: 1 with no label when the service stage does its
// whole job, else 0 with the reason's short name in the label reason (starting, attach-mode,
// bpffs, load, attach, degraded). One series at a time.
//
// It is unchecked (Describe sends nothing): the registry refuses two Descs of one name with
// different labels, and the series has a label only while the stage is not ready.
type readyCollector struct {
	status        func() (ok bool, step, why string)
	ready, reason *prometheus.Desc
}

func newReadyCollector(s *agent.ServiceStage) *readyCollector {
	return &readyCollector{status: s.Status,
		ready:  prometheus.NewDesc("sluice_services_ready", servicesReadyHelp, nil, nil),
		reason: prometheus.NewDesc("sluice_services_ready", servicesReadyHelp, []string{"reason"}, nil)}
}

const servicesReadyHelp = "1 when the eBPF service stage runs and has attached its programs, else 0 with the reason: starting, attach-mode (the kernel lacks what option bpf-attach asks), bpffs, load (the kernel refused a map or program), attach, degraded (started, but programs or socket hooks could not be attached; /readyz says why)."

func (c *readyCollector) Describe(chan<- *prometheus.Desc) {}

func (c *readyCollector) Collect(ch chan<- prometheus.Metric) {
	if ok, step, _ := c.status(); !ok {
		ch <- prometheus.MustNewConstMetric(c.reason, prometheus.GaugeValue, 0, step)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.ready, prometheus.GaugeValue, 1)
}
