module rdmamesh/mesh

go 1.19
