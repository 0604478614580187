// Command fake-gpu-plugin is a Kubernetes device plugin that advertises GPUs that do not exist.
//
// It serves the kubelet's device plugin API v1beta1
// (https://kubernetes.io/docs/concepts/extend-kubernetes/compute-storage-net/device-plugins/)
// for one extended resource (nvidia.com/gpu by default) with -count healthy devices, named by
// index ("0", "1", ...) as NVIDIA's plugin names them with --device-id-strategy=index. Like that
// plugin, Allocate tells each container which devices it got: NVIDIA_VISIBLE_DEVICES=<ids>, comma
// separated in the kubelet's order. It registers with the kubelet and registers again whenever
// the kubelet restarts (the kubelet removes every plugin socket when it starts).
//
// Test hook (issue 35, field case C34): with -health-file, the devices whose ids that file lists
// (comma or whitespace separated) are Unhealthy, all others Healthy; the file is read every
// 500 ms and every change is sent on ListAndWatch, as NVIDIA's plugin does after a critical Xid.
// The kubelet then drops those devices from the node's allocatable (never allocating them again)
// and, with the ResourceHealthStatus gate, shows them in the pod's
// status.containerStatuses[].allocatedResourcesStatus. A missing or empty file: all Healthy.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

type plugin struct {
	pluginapi.UnimplementedDevicePluginServer
	env string

	mu      sync.Mutex
	devices []*pluginapi.Device
	changed chan struct{} // closed (and replaced) whenever devices change
}

// snapshot returns a copy of the device list and the channel closed at its next change.
func (p *plugin) snapshot() ([]*pluginapi.Device, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	devices := make([]*pluginapi.Device, len(p.devices))
	for i, d := range p.devices {
		devices[i] = &pluginapi.Device{ID: d.ID, Health: d.Health}
	}
	return devices, p.changed
}

// setUnhealthy marks the devices in unhealthy Unhealthy and all others Healthy; it wakes every
// ListAndWatch stream when anything changed and returns whether it did.
func (p *plugin) setUnhealthy(unhealthy map[string]bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	changed := false
	for _, d := range p.devices {
		health := pluginapi.Healthy
		if unhealthy[d.ID] {
			health = pluginapi.Unhealthy
		}
		if d.Health != health {
			d.Health = health
			changed = true
		}
	}
	if changed {
		close(p.changed)
		p.changed = make(chan struct{})
	}
	return changed
}

// readHealthFile returns the device ids listed in path (none when it is missing).
func readHealthFile(path string) map[string]bool {
	ids := map[string]bool{}
	data, err := os.ReadFile(path)
	if err != nil {
		return ids
	}
	for _, id := range strings.FieldsFunc(string(data), func(r rune) bool {
		return r == ',' || r == ' ' || r == '\n' || r == '\t' || r == '\r'
	}) {
		ids[id] = true
	}
	return ids
}

func (p *plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

// ListAndWatch sends the whole device list, then again after every change of health.
func (p *plugin) ListAndWatch(_ *pluginapi.Empty, stream pluginapi.DevicePlugin_ListAndWatchServer) error {
	for {
		devices, changed := p.snapshot()
		if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: devices}); err != nil {
			return err
		}
		select {
		case <-stream.Context().Done():
			return nil
		case <-changed:
		}
	}
}

func (p *plugin) GetPreferredAllocation(context.Context, *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	return &pluginapi.PreferredAllocationResponse{}, nil
}

// Allocate answers each container request with the ids it was given, as an environment variable.
func (p *plugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, c := range req.ContainerRequests {
		log.Printf("allocate %s", strings.Join(c.DevicesIds, ","))
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Envs: map[string]string{p.env: strings.Join(c.DevicesIds, ",")},
		})
	}
	return resp, nil
}

func (p *plugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

// serve starts the gRPC server on socket and registers it with the kubelet at kubeletSocket.
func serve(p *plugin, socket, kubeletSocket, resource string) (*grpc.Server, error) {
	_ = os.Remove(socket)
	listener, err := net.Listen("unix", socket)
	if err != nil {
		return nil, err
	}
	server := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(server, p)
	go func() { _ = server.Serve(listener) }()
	conn, err := grpc.NewClient("unix://"+kubeletSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		server.Stop()
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     filepath.Base(socket),
		ResourceName: resource,
	})
	if err != nil {
		server.Stop()
		return nil, fmt.Errorf("register with the kubelet: %w", err)
	}
	return server, nil
}

func main() {
	resource := flag.String("resource", "nvidia.com/gpu", "extended resource name")
	count := flag.Int("count", 8, "devices to advertise")
	dir := flag.String("dir", pluginapi.DevicePluginPath, "the kubelet's device plugin folder")
	env := flag.String("env", "NVIDIA_VISIBLE_DEVICES", "variable that names a container's devices")
	healthFile := flag.String("health-file", "", "test hook: a file listing the ids of Unhealthy devices")
	flag.Parse()

	p := &plugin{env: *env, changed: make(chan struct{})}
	for i := 0; i < *count; i++ {
		p.devices = append(p.devices, &pluginapi.Device{ID: strconv.Itoa(i), Health: pluginapi.Healthy})
	}
	socket := filepath.Join(*dir, "fake-gpu.sock")
	kubeletSocket := filepath.Join(*dir, "kubelet.sock")
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)

	var server *grpc.Server
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		// Not serving, or the kubelet removed our socket (it restarted): (re)register.
		if _, err := os.Stat(socket); server == nil || err != nil {
			if server != nil {
				server.Stop()
				server = nil
			}
			if _, err := os.Stat(kubeletSocket); err == nil {
				s, err := serve(p, socket, kubeletSocket, *resource)
				if err != nil {
					log.Printf("not registered yet: %v", err)
				} else {
					server = s
					log.Printf("registered %d x %s at %s", *count, *resource, socket)
				}
			}
		}
		select {
		case <-stop:
			if server != nil {
				server.Stop()
			}
			_ = os.Remove(socket)
			return
		case <-tick.C:
			if *healthFile != "" {
				unhealthy := readHealthFile(*healthFile)
				if p.setUnhealthy(unhealthy) {
					log.Printf("health changed: unhealthy %v", unhealthy)
				}
			}
		}
	}
}
