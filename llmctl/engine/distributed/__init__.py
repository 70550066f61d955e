"""The collectives ranks use: process groups, object and tensor channels, the MoE expert exchange."""
