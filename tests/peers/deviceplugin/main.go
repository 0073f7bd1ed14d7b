// plexus-test-device-plugin: a minimal kubelet device plugin for plexus's real-node tests. It
// advertises one resource whose device IDs are the PCI addresses it is given (matching a fake
// sysfs), registers with the kubelet, and answers Allocate with nothing to inject: the kubelet
// then records the allocation, which plexus reads back through the pod-resources API.
//
//	plexus-test-device-plugin -dir /var/lib/kubelet/device-plugins -resource example.com/roce \
//	    -devices 0000:3b:00.2,0000:3b:00.3
package main

import (
	"context"
	"flag"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
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
}

func (p *plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

func (p *plugin) ListAndWatch(_ *pluginapi.Empty, s pluginapi.DevicePlugin_ListAndWatchServer) error {
	if err := s.Send(&pluginapi.ListAndWatchResponse{Devices: p.devices}); err != nil {
		return err
	}
	<-s.Context().Done()
	return nil
}

func (p *plugin) Allocate(_ context.Context, r *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for range r.ContainerRequests {
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{})
	}
	return resp, nil
}

func (p *plugin) GetPreferredAllocation(context.Context, *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	return &pluginapi.PreferredAllocationResponse{}, nil
}

func (p *plugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

func main() {
	dir := flag.String("dir", pluginapi.DevicePluginPath, "the kubelet's device-plugins directory")
	resource := flag.String("resource", "example.com/roce", "the resource name")
	devices := flag.String("devices", "", "device IDs, comma-separated")
	flag.Parse()

	p := &plugin{}
	for _, id := range strings.Split(*devices, ",") {
		if id != "" {
			p.devices = append(p.devices, &pluginapi.Device{ID: id, Health: pluginapi.Healthy})
		}
	}
	endpoint := "plexus-test.sock"
	sock := filepath.Join(*dir, endpoint)
	server := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(server, p)
	// listen serves the plugin on its socket, made anew: a kubelet that starts empties the
	// device-plugins directory, its own socket and ours.
	listen := func() {
		_ = os.Remove(sock)
		lis, err := net.Listen("unix", sock)
		if err != nil {
			log.Fatalf("listen %s: %v", sock, err)
		}
		go func() { _ = server.Serve(lis) }()
	}
	listen()
	// Registered as device plugins do, until the kubelet takes it: a kubelet just restarted
	// answers its health check before its device manager listens.
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, err := os.Stat(sock); err != nil {
			listen()
		}
		err := register(*dir, endpoint, *resource)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			log.Fatalf("register with the kubelet: %v", err)
		}
		log.Printf("register with the kubelet: %v (again in 250 ms)", err)
		time.Sleep(250 * time.Millisecond)
	}
	log.Printf("registered %s with %d devices", *resource, len(p.devices))

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
	server.Stop()
	_ = os.Remove(sock)
}

// register asks the kubelet (its registration socket in dir) to take the plugin at endpoint.
func register(dir, endpoint, resource string) error {
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, "kubelet.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version: pluginapi.Version, Endpoint: endpoint, ResourceName: resource,
	})
	return err
}
