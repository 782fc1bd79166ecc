#include "vm-c.h"
#include "vm-t.h"
