"""Where ranks live: the local emulated cluster (netns + veth + switch) and lab hosts over SSH."""
