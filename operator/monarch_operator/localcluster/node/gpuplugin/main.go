// Command fake-gpu-plugin is a Kubernetes device plugin that advertises GPUs that do not exist.
//
// It serves the kubelet's device plugin API v1beta1
// (https://kubernetes.io/docs/concepts/extend-kubernetes/compute-storage-net/device-plugins/)
// for one extended resource (nvidia.com/gpu by default) with -count healthy devices, named by
// index ("0", "1", ...) as NVIDIA's plugin names them with --device-id-strategy=index. Like that
// plugin, Allocate tells each container which devices it got: NVIDIA_VISIBLE_DEVICES=<ids>, comma
// separated in the kubelet's order. It registers with the kubelet and registers again whenever
// the kubelet restarts (the kubelet removes every plugin socket when it starts).
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
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

type plugin struct {
	pluginapi.UnimplementedDevicePluginServer
	devices []*pluginapi.Device
	env     string
}

func (p *plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

// ListAndWatch sends the device list once; the devices never change or fail.
func (p *plugin) ListAndWatch(_ *pluginapi.Empty, stream pluginapi.DevicePlugin_ListAndWatchServer) error {
	if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: p.devices}); err != nil {
		return err
	}
	<-stream.Context().Done()
	return nil
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
	flag.Parse()

	p := &plugin{env: *env}
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
		}
	}
}
